#!/usr/bin/env bash
# Other extensions than flash-attn, end to end on one GPU node without network: mirror the node's
# python + torch, build causal-conv1d, mamba-ssm, torch-scatter and gsplat with the build layer, a second
# causal-conv1d build (the planner's error on a learned recipe), publish, lock envs/gpu-node's
# `mamba` env, install, verify, then upstream's tests (a deterministic sample) and a tiny random
# Mamba model's forward and greedy generation in the installed prefix.
#
#   node/extensions.sh start [SECONDS]   copy the tree to $XF_WORK, start the chain in the
#                                         background, then poll up to SECONDS
#   node/extensions.sh poll [SECONDS]    wait for it up to SECONDS; print the summary
# To share a node with other work, start it under `taskset -c CPUS` and with CUDA_VISIBLE_DEVICES.
# XF_ONLY="RECIPE ...": those extensions alone, one after another, then envs/gpu-node's env XF_ENV (default:
# the first's own) installed and upstream's tests, a warm install, their wheels installed by pip and uv into
# copies of the node's pip torch venv; with XF_SECOND=1, then each built again, planned from its first
# build (the planner's error). XF_PACKAGES=DIR: no builds, the wheels of those packages alone.
# XF_EXTRAS="scipy ...": more distributions of the node's env to mirror (torch-cluster runs scipy).
# Each call copies the summary and logs into $OUT (if set). Needs in .carry/: site312.tar.xz
# (extforge's dependencies for the node's python), sdists/*.tar.gz, and upstream's test archives.
set -uo pipefail
XF_WORK=${XF_WORK:-/tmp/xf-ext}
PY=${XF_PYTHON:-python3}
mode=${1:-poll}
limit=${2:-540}

collect() {
    [[ -n "${OUT:-}" ]] || return 0
    mkdir -p "$OUT/logs"
    cp "$XF_WORK/summary.md" "$OUT/" 2>/dev/null
    for f in "$XF_WORK"/logs/*.log; do [[ -f $f ]] && tail -c 200000 "$f" > "$OUT/logs/$(basename "$f")"; done
    cp "$XF_WORK"/cost-store/*/*.json "$XF_WORK"/out*/logs/*.ninja_log "$OUT/logs/" 2>/dev/null
    true
}

run_chain() {
    cd "$XF_WORK/repo" || exit 1
    export PYTHONPATH="$XF_WORK/repo/src:$XF_WORK/site" PATH="$XF_WORK/site/bin:$PATH" PYTHONUNBUFFERED=1
    export EXTFORGE_CACHE="$XF_WORK/cache" EXTFORGE_SOURCES="$XF_WORK/sources" EXTFORGE_COST_STORE="$XF_WORK/cost-store"
    local xf=("$PY" -m extforge) ch="$XF_WORK/mirror" out="$XF_WORK/out"
    local maps=(--channel-map "conda-forge=file://$ch" --channel-map "https://conda.internal.example/extforge=file://$XF_WORK/channel")
    step() {  # step NAME CMD...: run, time, record
        local name=$1; shift
        local t0=$SECONDS log="$XF_WORK/logs/$name.log"
        echo "== $name: $*" > "$log"
        "$@" >> "$log" 2>&1
        local rc=$?
        printf '| %s | %s | %d |\n' "$name" "$([[ $rc == 0 ]] && echo ok || echo "FAILED (exit $rc)")" $((SECONDS - t0)) >> "$XF_WORK/steps.md"
        summarize
        return $rc
    }
    step node "$PY" -c 'import sys, torch, os; print(sys.version.split()[0], torch.__version__, torch.version.cuda, torch.cuda.get_device_name(0), os.cpu_count(), "cores")'
    local recipes=(causal-conv1d mamba-ssm torch-scatter gsplat)
    [[ -n "${XF_ONLY:-}" ]] && read -ra recipes <<< "$XF_ONLY"
    for r in "${recipes[@]}"; do
        step "sources-$r" "${xf[@]}" sources fetch "recipe/$r" --from "$XF_WORK/repo/.carry/sdists" --dest "$XF_WORK/sources" || return
    done
    local extras=()
    for e in einops transformers pytest packaging rich ${XF_EXTRAS:-}; do extras+=(--extra "$e"); done
    step mirror "${xf[@]}" mirror --from-env "$PY" --channel "$ch" --cuda-home /usr/local/cuda "${extras[@]}" || return
    if [[ -n "${XF_ONLY:-}" ]]; then
        only "$ch" "$out"
        return
    fi
    # causal-conv1d first, alone: its build time is compared across runs (its backward unit compiles
    # as parallel parts, planned from the costs the recipe ships).
    step build-causal-conv1d "${xf[@]}" build recipe/causal-conv1d -c "$ch" -o "$out" || return
    # torch-scatter's units are long: it builds beside the others, in an output folder of its own
    # (two rattler-builds never index one folder at once).
    step build-torch-scatter "${xf[@]}" build recipe/torch-scatter -c "$ch" -o "$XF_WORK/out-scatter" &
    local scatter=$!
    # The second build is planned from what the first one's ninja log taught the cost store; it
    # runs beside mamba-ssm's build (the planner is told of neither: its error includes that).
    step plan-causal-conv1d-second "${xf[@]}" plan recipe/causal-conv1d
    step build-causal-conv1d-second "${xf[@]}" build recipe/causal-conv1d -c "$ch" -o "$XF_WORK/out2" &
    local second=$!
    step build-mamba-ssm "${xf[@]}" build recipe/mamba-ssm -c "$ch" -c "$out" -o "$out"
    step build-gsplat "${xf[@]}" build recipe/gsplat -c "$ch" -o "$out"
    wait "$scatter" "$second"
    cp "$XF_WORK"/out-scatter/linux-64/*.conda "$out/linux-64/" 2>/dev/null
    publish_lock_install mamba "$out"/linux-64/*.conda || return
    local tests="$XF_WORK/upstream-tests"
    tar -C "$tests" -xzf "$XF_WORK/sources/sha256/"*/causal_conv1d-1.7.0.tar.gz
    for a in .carry/mamba-v2.3.2.post1-tests.tar.gz .carry/pytorch_scatter-2.1.2-tests.tar.gz; do tar -C "$tests" -xzf "$a"; done
    step test-causal-conv1d "${pt[@]}" "$tests/causal_conv1d-1.7.0/tests/test_causal_conv1d.py"
    step test-mamba-selective-scan "${pt[@]}" "$tests/mamba-v2.3.2.post1/tests/ops/test_selective_scan.py"
    EXTFORGE_SAMPLE_EVERY=1 step test-torch-scatter "${pt[@]}" "$tests/pytorch_scatter-2.1.2/test"
    test_gsplat
    step mamba-tiny-model "$XF_WORK/env/bin/python" node/mamba_tiny.py
}

only() {  # only MIRROR OUT: the XF_ONLY extensions (a space-separated list), one after another
    local ch=$1 out=$2 r
    local -a only
    read -ra only <<< "$XF_ONLY"
    if [[ -n "${XF_PACKAGES:-}" ]]; then
        # XF_PACKAGES=DIR: the packages of an earlier run, no build: their wheels alone.
        mkdir -p "$XF_WORK/upstream-tests"
        for r in "${only[@]}"; do tar -C "$XF_WORK/upstream-tests" -xzf .carry/*"${r#torch-}"*-tests.tar.gz; done
        wheels "$XF_PACKAGES"/*.conda
        return
    fi
    # Each first, alone on the node, into an output folder of its own (its ninja log is the planner's
    # first measurement), with its recipe's tests.
    for r in "${only[@]}"; do
        step "build-$r" "${xf[@]}" build "recipe/$r" -c "$ch" -o "$out/$r" || return
    done
    # XF_ENV: the envs/gpu-node env that holds them (default: the one extension's own), its upstream tests.
    local env=${XF_ENV:-${only[0]}} packages=("$out"/*/linux-64/*.conda)
    publish_lock_install "$env" "${packages[@]}" || return
    for r in "${only[@]}"; do "test_$r"; done
    step install-warm "${xf[@]}" install "$env" --prefix "$XF_WORK/env-warm" --lock "$XF_WORK/pixi.lock" --manifest envs/gpu-node/pixi.toml "${maps[@]}"
    wheels "${packages[@]}"
    # XF_SECOND=1: each built again, planned from what its first build taught the cost store (the
    # planner's error); only the compiles count: no recipe tests.
    [[ -n "${XF_SECOND:-}" ]] || return 0
    for r in "${only[@]}"; do
        step "plan-$r-second" "${xf[@]}" plan "recipe/$r"
        step "build-$r-second" "${xf[@]}" build "recipe/$r" -c "$ch" -o "$XF_WORK/out2/$r" --no-test || return
        step "planner-error-$r" "${xf[@]}" plan --compare "$out/$r"/logs/*.ninja_log "$XF_WORK/out2/$r"/logs/*.ninja_log
    done
}

wheels() {  # wheels PACKAGE...: as wheels in an index, installed by pip and by uv into copies of the node's pip torch venv
    local index="$XF_WORK/wheels" venv base projects=() p
    step publish-wheels "${xf[@]}" publish "$@" --wheels "$index" --upstream "$ch" || return
    for p in "$@"; do p=$(basename "$p"); projects+=("${p%-*-*}"); done
    local url
    url="file://$(ls -d "$index"/*/simple | head -1)"
    base=$("$PY" -c 'import sys; print(sys.prefix)')
    local uv
    uv=$("$PY" -c 'import uv; print(uv.find_uv_bin())')
    for client in pip uv; do
        venv="$XF_WORK/venv-$client"
        step "venv-$client" bash -c "cp -al '$base' '$venv' 2>/dev/null || { rm -rf '$venv'; cp -a '$base' '$venv'; }" || continue
        local vpy="$venv/bin/$(basename "$PY")"
        if [[ $client == pip ]]; then
            step "pip-install-wheels" env -u PYTHONPATH PIP_CONFIG_FILE=/dev/null "$vpy" -m pip install --no-cache-dir --index-url "$url" "${projects[@]}" || continue
        else
            step "uv-install-wheels" env -u PYTHONPATH UV_NO_CONFIG=1 "$uv" pip install --no-cache --python "$vpy" --index-url "$url" "${projects[@]}" || continue
        fi
        step "import-wheels-$client" env -u PYTHONPATH "$vpy" -c 'import sys, importlib, torch
for m in sys.argv[1:]: importlib.import_module(m.replace("-", "_")); print(m, "imports beside torch", torch.__version__)' "${projects[@]}"
    done
    for p in "$index"/*/simple/*/*.whl; do
        step "audit-wheel-$(basename "$p" | cut -d- -f1)" "${xf[@]}" audit "$p" --against "$XF_WORK/venv-pip"
    done
    # Upstream's tests with the pip venv's python (the same files as the prefix's).
    local r
    for r in "${only[@]}"; do
        EXTFORGE_SAMPLE_EVERY=1 step "test-$r-wheel" env "PYTHONPATH=$XF_WORK/repo/node" "$XF_WORK/venv-pip/bin/$(basename "$PY")" \
            -m pytest -q -p pytest_sample -p no:cacheprovider "$XF_WORK/upstream-tests/$(ls "$XF_WORK/upstream-tests" | grep -m1 "${r#torch-}")/test"
    done
}

publish_lock_install() {  # publish_lock_install ENV PACKAGE...: into the channel, then envs/gpu-node's ENV
    local env=$1; shift
    step publish "${xf[@]}" publish "$@" --channel "$XF_WORK/channel" --upstream "$ch" || return
    step lock "${xf[@]}" lock --manifest envs/gpu-node/pixi.toml --env "$env" --lock "$XF_WORK/pixi.lock" "${maps[@]}" || return
    step install "${xf[@]}" install "$env" --prefix "$XF_WORK/env" --lock "$XF_WORK/pixi.lock" --manifest envs/gpu-node/pixi.toml "${maps[@]}" || return
    step verify "${xf[@]}" verify "$XF_WORK/env" --env "$env" --lock "$XF_WORK/pixi.lock" "${maps[@]}"
    mkdir -p "$XF_WORK/upstream-tests"
    # Upstream's test files, run from outside any source tree so the installed packages are imported.
    # (PYTHONPATH for the tests alone: the steps after them run extforge from the repo's src/.)
    export EXTFORGE_SAMPLE_EVERY=${XF_SAMPLE_EVERY:-7}
    pt=(env "PYTHONPATH=$XF_WORK/repo/node" "$XF_WORK/env/bin/python" -m pytest -q -p pytest_sample -p no:cacheprovider)
}

test_pyg() {  # test_pyg RECIPE ARCHIVE: upstream's test/ folder (.carry/ARCHIVE-tests.tar.gz), every test
    tar -C "$XF_WORK/upstream-tests" -xzf ".carry/$2-tests.tar.gz"
    EXTFORGE_SAMPLE_EVERY=1 step "test-$1" "${pt[@]}" "$XF_WORK/upstream-tests/$2/test"
}
test_torch-scatter() { test_pyg torch-scatter pytorch_scatter-2.1.2; }
test_torch-cluster() { test_pyg torch-cluster pytorch_cluster-1.6.3; }

test_gsplat() {
    # The sdist's tests that need nothing outside the env: not test_basic.py and test_ftheta.py (they
    # read assets/test_garden.npz, which only upstream's repository has), test_compression.py
    # (imageio, torchpq, plas), test_rasterization.py (its reference is nerfacc's), test_2dgs.py
    # (pytest >= 9 refuses its marks on fixtures at collection).
    tar -C "$XF_WORK/upstream-tests" -xzf "$XF_WORK/sources/sha256/"*/gsplat-1.5.3.tar.gz
    step test-gsplat "${pt[@]}" "$XF_WORK/upstream-tests/gsplat-1.5.3/tests/test_strategy.py"
}

summarize() {
    {
        echo "# Other extensions on $( (nvidia-smi --query-gpu=name --format=csv,noheader | head -1) 2>/dev/null) ($(nproc) cores), $(date -u +%F)"
        echo
        echo "| step | result | seconds |"
        echo "|---|---|---|"
        cat "$XF_WORK/steps.md" 2>/dev/null
        echo
        for t in causal-conv1d mamba-selective-scan torch-scatter torch-cluster torch-scatter-wheel torch-cluster-wheel gsplat; do
            local f="$XF_WORK/logs/test-$t.log"
            [[ -f $f ]] && echo "- upstream tests, $t: $(grep -E '^[0-9]+ (passed|failed)|passed|failed' "$f" | tail -1)"
        done
        grep -h "numbers:" "$XF_WORK"/logs/plan-*-second.log 2>/dev/null | sed 's/^/- plan: /'
        grep -h "node-speed" "$XF_WORK"/logs/build-*-second.log 2>/dev/null | sed 's/^/- second build: /'
        grep -h "EXTFORGE_SPLIT_UNITS" "$XF_WORK"/logs/plan-*.log 2>/dev/null | sed 's/^/- plan: /'
        grep -Hho "split: [A-Za-z_0-9]* in up to [0-9]* parts" "$XF_WORK"/out*/logs/*.log 2>/dev/null | sort -u | sed 's/^/- layer: /'
        grep -h "" "$XF_WORK"/logs/planner-error-*.log 2>/dev/null | sed 's/^/- /'
    } > "$XF_WORK/summary.md"
}

if [[ $mode == start && ! -d "$XF_WORK/repo" ]]; then
    mkdir -p "$XF_WORK/logs" "$XF_WORK/site"
    cp -a . "$XF_WORK/repo"
    tar -C "$XF_WORK/site" -xJf .carry/site312.tar.xz
    export -f run_chain only wheels summarize publish_lock_install test_gsplat test_pyg test_torch-scatter test_torch-cluster
    export XF_WORK PY
    setsid bash -c 'run_chain; echo done > "$XF_WORK/done"' > "$XF_WORK/chain.log" 2>&1 < /dev/null &
fi
t0=$SECONDS
while [[ ! -f "$XF_WORK/done" ]] && (( SECONDS - t0 < limit )); do sleep 10; done
summarize 2>/dev/null
cat "$XF_WORK/summary.md" 2>/dev/null
[[ -f "$XF_WORK/done" ]] && echo "chain: done" || echo "chain: running"
collect
