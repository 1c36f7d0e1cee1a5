"""The voice library (docs/api.md "Voices"): uploaded voices stored on a shared directory."""
