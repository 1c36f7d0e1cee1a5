"""Model families, one folder each, behind one small interface."""
