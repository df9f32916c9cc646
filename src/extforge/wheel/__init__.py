"""Wheels of audited conda packages and the per-torch wheel index pip and uv install from.

One build, two artifacts: `make.wheel_from_conda` writes the compiled files of a package extforge
built and audited into a wheel (never a second compile), tagged from what its binaries need
(`manylinux`), versioned and pinned from the package's own run requirements (`requirements`);
`index.publish_wheels` serves it from `DIR/torch<X.Y.Z>-<cuda>/simple/` (docs/site-admin.md).
"""
