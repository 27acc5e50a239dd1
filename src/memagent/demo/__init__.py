"""`memagent demo`: the paper's claims reproduced at CPU scale (see pipeline.py)."""
