"""The package list, which pyproject.toml cannot state: the folder ``kernels/`` installs
under the import name ``chatsite_kernels``.

The folder keeps no ``__init__.py``: the project root is on ``sys.path`` whenever the site,
the tests or ``manage.py`` run from it, and a regular package named ``kernels`` there would
be imported in place of Hugging Face's hub-kernels distribution, which transformers imports.
A folder without ``__init__.py`` is at most a namespace portion, which any installed package
of the same name wins over. See docs/architecture.md, "Import names".
"""

from setuptools import find_packages, setup

KERNELS_FOLDER = "kernels"
KERNELS_IMPORT_NAME = "chatsite_kernels"

kernel_packages = [KERNELS_IMPORT_NAME] + [
    f"{KERNELS_IMPORT_NAME}.{name}" for name in find_packages(KERNELS_FOLDER)
]

setup(
    packages=find_packages(include=["chatsite*", "conversations*", "inference*"]) + kernel_packages,
    package_dir={KERNELS_IMPORT_NAME: KERNELS_FOLDER},
)
