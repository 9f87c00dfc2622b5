"""The wheel carries what flashcore needs at run time beside its Python code: the default registry
(variants.yaml) and kernels/ (the contract, the binding, the shared headers and every shipped kernel), copied
into flashcore_cli/_data, where flashcore_cli/core/paths.py finds them. An editable install reads the
checkout itself, so nothing is copied there."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
SHIPPED = ["variants.yaml", "kernels"]


class BuildWithData(build_py):
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return
        data = Path(self.build_lib) / "flashcore_cli" / "_data"
        for name in SHIPPED:
            src = HERE / name
            files = [src] if src.is_file() else sorted(p for p in src.rglob("*") if p.is_file())
            for f in files:
                rel = f.relative_to(HERE)
                if "__pycache__" in rel.parts:
                    continue
                self.mkpath(str((data / rel).parent))
                self.copy_file(str(f), str(data / rel), preserve_mode=False)


setup(cmdclass={"build_py": BuildWithData})
