"""Gateway: public gRPC/HTTP faces, admission, routing and sessions."""
