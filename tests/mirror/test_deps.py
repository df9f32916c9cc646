"""Dist metadata → conda names, match specs and the flattened dependency closure."""

from extforge.mirror.deps import (
    DistInfo,
    closure,
    conda_match_spec,
    conda_name,
    conda_version,
    marker_environment,
    python_pin,
    requirements_for,
)

ENV = marker_environment("3.11", "3.11.7")


def test_conda_names_follow_conda_forge():
    assert conda_name("torch") == "pytorch"
    assert conda_name("huggingface_hub") == "huggingface_hub"
    assert conda_name("PyYAML") == "pyyaml"
    assert conda_name("typing_extensions") == "typing_extensions"
    assert conda_name("nvidia_cuda_runtime") == "nvidia-cuda-runtime"


def test_versions_and_specs_drop_local_labels():
    assert conda_version("2.14.1+cu130") == "2.14.1"
    assert conda_match_spec("torch", "==2.14.1+cu130") == "pytorch ==2.14.1"
    assert conda_match_spec("triton", "~=3.8.0") == "triton >=3.8.0,3.8.*"
    assert conda_match_spec("cuda-bindings", "<14,>=13.0.3") == "cuda-bindings <14,>=13.0.3"
    assert conda_match_spec("foo", "==1.*") == "foo 1.*"
    assert conda_match_spec("jinja2", "") == "jinja2"
    assert python_pin("3.12") == "python >=3.12,<3.13.0a0"


def test_markers_select_the_platform_and_extras():
    reqs = [
        'nvidia-nccl-cu13==2.30.7; platform_system == "Linux"',
        'pywin32; sys_platform == "win32"',
        'pyyaml; extra == "pyyaml"',
        'tomli; python_version < "3.11"',
    ]
    assert [d.name for d in requirements_for(reqs, ENV)] == ["nvidia-nccl-cu13"]
    assert {d.name for d in requirements_for(reqs, ENV, ["pyyaml"])} == {"nvidia-nccl-cu13", "pyyaml"}


def test_closure_folds_extras_of_dependencies_into_the_dependent():
    dists = {
        "torch": DistInfo("torch", "2.14.1", ['cuda-toolkit[cublas]==13.0.3; platform_system == "Linux"', "filelock"]),
        "cuda-toolkit": DistInfo("cuda-toolkit", "13.0.3", ['nvidia-cublas==13.1; extra == "cublas"']),
        "nvidia-cublas": DistInfo("nvidia-cublas", "13.1", []),
        "filelock": DistInfo("filelock", "4.2", ["not-installed>=1"]),
    }
    c = closure(["torch"], dists, ENV)
    assert c.order == ["torch", "cuda-toolkit", "filelock", "nvidia-cublas"]
    assert {d.conda_spec for d in c.depends["torch"]} == {
        "cuda-toolkit ==13.0.3",
        "filelock",
        "nvidia-cublas ==13.1",
    }
    # A dependency the source lacks is reported and left out rather than making the channel unsolvable.
    assert c.missing == {"not-installed": "filelock"}
    assert c.depends["filelock"] == []
