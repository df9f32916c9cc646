"""The path from built packages to identical environments on every node.

publish (channel folder or server) → index (repodata) → lock (pixi.lock from pixi.toml)
→ install (frozen, hash-checked) → verify (per node: records, file hashes, admission).
"""
