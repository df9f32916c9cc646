"""The GPU proof, end to end, on one bare GPU node without network (`scripts/gpu-e2e PHASE`).

    mirror the node's own python + torch into an upstream channel
    → build demo-ext and flash-attn with rattler-build (flash-attn in the background: ~17 min)
    → audit → publish to a channel folder → lock envs/gpu-node/pixi.toml
    → install the lock into a fresh prefix → extforge verify → tests/gpu with the prefix's python
    → attention benchmark → the same packages as wheels, pip-installed into a copy of the node
    python's venv and tested there → a warm compile-cache rebuild of flash-attn.
With --fa3, FlashAttention-3 (recipe/flash-attn-3, a kernel subset) is built beside flash-attn,
published, locked and installed with it, and tested by our tests/gpu, a sample of upstream's
hopper/test_flash_attn.py and the benchmark. `--no-flash-attn --fa3 --fa3-head-dims all
--fa3-dtypes all --fa3-features all` builds the full FA3 alone, planned by `extforge build` for
the CPUs the run may use (start it under taskset to share a node), audits its sm_90a and sm_80
code, and samples every upstream test function, one shard per GPU (`finish --env fa3-full`).

A call to a remote machine may be limited to minutes, so the run is split into phases that
share a work folder and can be chained: `start` (set up, mirror, start the builds), `wait`
(poll the background builds), `finish` (everything after the build), `wheels` (the pip user's
side: wheels of what `finish` published, installed by pip into the node's pip torch venv, and
tested), `rebuild` (wait for the warm compile-cache rebuild that `finish` started). `all` runs
them in one go. Each phase
rewrites the summary (summary.md / summary.json in --out), so whatever happened so far survives
a phase that fails; what `start` was asked (--fa3, --archs, ...) is kept in the work folder's
state, and a later phase uses it unless given again (state.py).

What the node needs: python3 >= 3.11 with torch (CUDA) and its nvidia libraries installed, a
CUDA toolkit of torch's major (packaged into the mirror with --cuda-home), gcc, and our Python
dependencies either importable or bundled in .carry/site312.tar.xz (a `pip install --target`
tree of extforge's dependencies), plus the flash-attn sdist in .carry/ (offline nodes cannot
fetch it): `carry`, on a machine with network, prepares them.

Modules: `state` (the work folder's record: steps, facts, phases, the options start was given;
the summary), `node` (what the node is: GPUs, cores, CPU halves), `builds` (background builds
that outlive a call, their samplers and results), `phases` (start, wait, finish, rebuild),
`wheels` (the wheel phase), `carry` (what an offline node needs), `cli` (the options and the
phase dispatch).
"""
