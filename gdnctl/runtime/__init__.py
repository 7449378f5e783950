"""What runs on the cluster: `python -m gdnctl.runtime --config engine.yaml` (imports torch lazily)."""
