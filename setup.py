"""Build glue that pyproject.toml cannot express: the simulator's C core and the mapping of
the top-level scenarios/ folder into the package. Metadata lives in pyproject.toml."""

from setuptools import Extension, find_packages, setup

setup(
    packages=find_packages(include=["umctl", "umctl.*"]) + ["umctl.scenarios_data"],
    package_dir={"umctl": "umctl", "umctl.scenarios_data": "scenarios"},
    package_data={"umctl.scenarios_data": ["*.toml"]},
    ext_modules=[Extension("umctl.sim._simcore", ["umctl/sim/_simcore.c"],
                           extra_compile_args=["-O2", "-fvisibility=default"])],
)
