"""PersonaPlex (Moshi finetune): Helium temporal transformer + depformer, full-duplex."""
