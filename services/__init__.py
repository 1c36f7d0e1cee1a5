"""The stage services: ``services.talker`` (text -> codec frames), ``services.codec`` (frames <-> PCM)."""
