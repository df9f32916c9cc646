"""Cache keys, build strings, torch facts, nvcc parsing: the pure parts of the mirror."""

from extforge.mirror.inputs import wheel_fits
from extforge.mirror.recipes import PackageJob, bytecode_spec, render_recipe
from extforge.mirror.toolchain import parse_nvcc_version
from extforge.mirror.torch_pkg import build_string, parse_version_py


def _job(**kw) -> PackageJob:
    base = dict(name="foo", version="1.0", build_string="py311_h${{ hash }}_0", depends=["python"], identity="abc")
    return PackageJob(**(base | kw))


def test_cache_key_changes_with_every_input():
    key = _job().cache_key()
    assert key == _job().cache_key()
    assert key != _job(identity="abd").cache_key()  # artifact content
    assert key != _job(depends=["python", "bar"]).cache_key()
    assert key != _job(manifest={"texts": [["etc/x.sh", "export A=1", "644"]]}).cache_key()
    assert key != _job(name="bar").cache_key()
    # The Python that compiles a package's .pyc: its version, not where it lives.
    compiled = _job(manifest={"bytecode": bytecode_spec("/opt/py/bin/python3.12", "3.12.4")}).cache_key()
    assert compiled not in (key, _job(manifest={"bytecode": bytecode_spec("/opt/py/bin/python3.12", "3.12.5")}).cache_key())
    assert compiled == _job(manifest={"bytecode": bytecode_spec("/usr/bin/python3.12", "3.12.4")}).cache_key()


def test_rendered_recipe_is_yaml_with_our_values(tmp_path):
    from ruamel.yaml import YAML

    text = render_recipe(_job(run_exports=["python_abi 3.11.* *_cp311"]), tmp_path / "m.json")
    doc = YAML(typ="safe").load(text)
    assert doc["package"] == {"name": "foo", "version": "1.0"}
    assert doc["requirements"]["run"] == ["python"]
    assert doc["requirements"]["run_exports"]["weak"] == ["python_abi 3.11.* *_cp311"]
    assert "_stage.py" in doc["build"]["script"][0]


def test_pytorch_build_string_names_cuda_and_python():
    assert build_string("13.0", "3.11") == "cuda130_py311_h${{ hash }}_0"
    assert build_string(None, "3.12") == "cpu_py312_h${{ hash }}_0"
    facts = parse_version_py("__version__ = '2.14.1+cu130'\ndebug = False\ncuda: Optional[str] = '13.0'\n")
    assert (facts.version, facts.cuda) == ("2.14.1+cu130", "13.0")
    assert parse_version_py("__version__ = '2.13.0+cpu'\ncuda: Optional[str] = None\n").cuda is None


def test_nvcc_version_and_wheel_tags():
    assert parse_nvcc_version("Cuda compilation tools, release 13.0, V13.0.88\n") == "13.0.88"
    assert parse_nvcc_version("garbage") is None
    assert wheel_fits("torch-2.14.1-cp311-cp311-manylinux_2_28_x86_64.whl", "3.11")
    assert not wheel_fits("torch-2.14.1-cp312-cp312-manylinux_2_28_x86_64.whl", "3.11")
    assert wheel_fits("ninja-1.13-py3-none-manylinux2014_x86_64.whl", "3.11")
    assert wheel_fits("x-1-cp39-abi3-manylinux_2_17_x86_64.whl", "3.11")
    assert not wheel_fits("x-1-py3-none-macosx_11_0_arm64.whl", "3.11")
