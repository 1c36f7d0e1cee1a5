"""Stage links (docs/protocol.md §12): every request between two connected stages on one long-lived call."""
