"""tools/install_pins.sh (the pinned install of tools/setup.sh) on a stranger's machine, played
with local package indexes: the machine's index lacks a `+cpu` pin (PyPI serves no torch
`+cpu` build), so the first pass fails and the second, with PyTorch's CPU index as an extra
index (here a local one, through DAPO_TORCH_INDEX), installs it; where that index lacks it
too, the script fails naming the pin."""

import base64
import hashlib
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PIN = "dapo-probe==1.0+cpu"


def _wheel(dest: Path) -> Path:
    """A minimal pure-Python wheel of dapo-probe 1.0+cpu (the shape of torch's +cpu pin)."""
    name, version = "dapo_probe", "1.0+cpu"
    info = f"{name}-{version}.dist-info"
    files = {
        f"{name}/__init__.py": "VERSION = '1.0+cpu'\n",
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: dapo-probe\nVersion: {version}\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = []
    for path, text in files.items():
        digest = base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()).rstrip(b"=")
        record.append(f"{path},sha256={digest.decode()},{len(text.encode())}")
    files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
    out = dest / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(out, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return out


@pytest.fixture(scope="module")
def venv(tmp_path_factory) -> Path:
    d = tmp_path_factory.mktemp("stranger")
    subprocess.run([sys.executable, "-m", "venv", str(d / "venv")], check=True, timeout=120)
    return d / "venv" / "bin" / "python"


def _install(
    venv: Path, tmp_path: Path, torch_index: Path, pin: str = PIN
) -> subprocess.CompletedProcess:
    machine_index = tmp_path / "machine-index"  # a simple index without the +cpu pin
    machine_index.mkdir(exist_ok=True)
    lock = tmp_path / "probe.lock"
    lock.write_text(pin + "\n")
    env = {
        k: v for k, v in os.environ.items() if not k.startswith("PIP_") and k != "DAPO_TORCH_INDEX"
    }
    env.update(
        PIP_CONFIG_FILE=os.devnull,  # none of this machine's pip configuration
        PIP_INDEX_URL=machine_index.as_uri(),
        PIP_DISABLE_PIP_VERSION_CHECK="1",
        PIP_NO_CACHE_DIR="1",
        DAPO_TORCH_INDEX=torch_index.as_uri(),
    )
    return subprocess.run(
        ["bash", str(REPO / "tools" / "install_pins.sh"), str(venv), str(lock)],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
    )


def test_a_pin_missing_from_the_machines_index_comes_from_the_torch_index(venv, tmp_path):
    torch_index = tmp_path / "torch-index"
    project = torch_index / "dapo-probe"
    project.mkdir(parents=True)
    wheel = _wheel(project)
    href = wheel.name.replace("+", "%2B")  # a PEP 503 project page, as PyTorch's index serves
    (project / "index.html").write_text(
        f'<html><body><a href="{href}">{wheel.name}</a></body></html>'
    )
    out = _install(venv, tmp_path, torch_index)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "retrying with" in out.stdout and torch_index.as_uri() in out.stdout
    probe = subprocess.run(
        [str(venv), "-c", "import dapo_probe; print(dapo_probe.VERSION)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert probe.stdout.strip() == "1.0+cpu"


def test_a_pin_no_index_serves_fails_naming_it(venv, tmp_path):
    empty = tmp_path / "empty-index"
    empty.mkdir()
    pin = "dapo-probe==2.0+cpu"  # not the one the other test installed in this venv
    out = _install(venv, tmp_path, empty, pin)
    assert out.returncode == 1
    assert "retrying with" in out.stdout
    assert pin in out.stderr and "DAPO_TORCH_INDEX" in out.stderr
