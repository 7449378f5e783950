"""`gdnctl doctor`: can this machine run this preset? Facts are probed (probes.py), then judged (checks.py)."""
