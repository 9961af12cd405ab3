"""No import name of ours shadows an installed distribution's.

The project root is on ``sys.path`` whenever the site, ``manage.py`` or the tests run from it,
ahead of site-packages: a regular package of ours named like an installed one is imported in
its place. Hugging Face's ``kernels`` (which transformers imports) met exactly that from our
``kernels/`` folder, which therefore has no ``__init__.py`` and installs as ``chatsite_kernels``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import sysconfig
from importlib.metadata import distribution, packages_distributions
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUR_DISTRIBUTION = "chatsite"


def our_import_names(root: Path) -> set[str]:
    """What ``import NAME`` finds in ``root`` first: its regular packages and modules, and the
    names our installed distribution declares. A folder without ``__init__.py`` is at most a
    namespace portion, which any installed package of the same name wins over."""
    names = {path.name for path in root.iterdir() if (path / "__init__.py").is_file()}
    names |= {path.stem for path in root.glob("*.py")}
    names |= {top for top, dists in packages_distributions().items() if OUR_DISTRIBUTION in dists}
    return names


def installed_import_names() -> dict[str, list[str]]:
    """Top-level import names of every installed distribution but ours."""
    return {
        top: dists
        for top, dists in packages_distributions().items()
        if set(dists) - {OUR_DISTRIBUTION} and not top.startswith("__editable__")
    }


def test_no_import_name_of_ours_is_an_installed_distributions() -> None:
    installed = installed_import_names()
    assert {name: installed[name] for name in our_import_names(ROOT) if name in installed} == {}


def test_the_check_catches_a_kernels_package_at_the_root(tmp_path: Path) -> None:
    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    assert "kernels" in installed_import_names()  # the lock keeps Hugging Face's package
    assert "kernels" in our_import_names(tmp_path) & installed_import_names().keys()


def test_the_kernels_folder_imports_only_under_its_own_name() -> None:
    assert not (ROOT / "kernels" / "__init__.py").exists()
    import chatsite_kernels.cpu.build

    assert Path(chatsite_kernels.cpu.build.__file__).resolve().parent == ROOT / "kernels" / "cpu"


def test_hugging_face_kernels_imports_as_itself_from_the_project_root() -> None:
    """As ``manage.py`` and the server run: the project root first on ``sys.path``. transformers
    imports the hub-kernels integration (and with it ``kernels``) when it loads activations."""
    probe = (
        "import json, kernels, transformers.integrations.hub_kernels, transformers.activations\n"
        "from transformers import AutoConfig\n"
        "config = AutoConfig.for_model('llama', hidden_size=64)\n"
        "from kernels import CUDAProperties\n"
        "print(json.dumps({'kernels': kernels.__file__, 'model_type': config.model_type}))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert result.returncode == 0, result.stderr[-2000:]
    loaded = json.loads(result.stdout.splitlines()[-1])
    assert loaded["model_type"] == "llama"
    hf_kernels = Path(str(distribution("kernels").locate_file("kernels/__init__.py"))).resolve()
    assert Path(loaded["kernels"]).resolve() == hf_kernels
    assert hf_kernels.is_relative_to(Path(sysconfig.get_paths()["purelib"]).resolve())
