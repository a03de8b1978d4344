"""Build: one Cython extension over the pure-C core in csrc/.

No machine-specific flags: SIMD kernels carry per-function target attributes and are chosen
at run time. OpenMP is used when the compiler accepts it, otherwise the core runs serially.
"""
import os
import shutil
import subprocess
import sys
import tempfile
from glob import glob

from Cython.Build import cythonize
from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

# csrc/include holds the public header; the kernels (codecs/), the store (store/) and what they
# share (runtime/) reach each other's private headers by relative path.
C_SOURCES = sorted(glob(os.path.join("csrc", "**", "*.c"), recursive=True))
C_HEADERS = sorted(glob(os.path.join("csrc", "**", "*.h"), recursive=True))


def _compiler_accepts(compiler, flag):
    """Compile and link a tiny OpenMP program with `flag`; True if it works."""
    tmp = tempfile.mkdtemp()
    try:
        src = os.path.join(tmp, "omp.c")
        with open(src, "w") as f:
            f.write("#include <omp.h>\nint main(void){return omp_get_max_threads() < 1;}\n")
        objs = compiler.compile([src], output_dir=tmp, extra_postargs=[flag])
        compiler.link_executable(objs, os.path.join(tmp, "omp"), extra_postargs=[flag])
        return True
    except Exception:
        return False
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


class BuildExt(build_ext):
    def build_extensions(self):
        is_msvc = self.compiler.compiler_type == "msvc"
        # No fused multiply-add contraction: every path must round exactly like the reference
        # (GCC in ISO C mode does not fuse; clang would, by default).
        base = ["/O2", "/fp:precise"] if is_msvc else [
            "-O3", "-std=c11", "-fno-strict-aliasing", "-ffp-contract=off"]
        omp = [] if os.environ.get("ACTCODEC_NO_OPENMP") else (
            ["/openmp"] if is_msvc else ["-fopenmp"])
        if omp and not _compiler_accepts(self.compiler, omp[0]):
            print("actcodec: compiler has no OpenMP; building the serial core", file=sys.stderr)
            omp = []
        for ext in self.extensions:
            ext.extra_compile_args = base + omp
            ext.extra_link_args = [] if is_msvc else omp
        super().build_extensions()


extensions = [
    Extension(
        "actcodec._ext",
        sources=["actcodec/_ext.pyx"] + C_SOURCES,
        include_dirs=[os.path.join("csrc", "include")],
        depends=C_HEADERS,  # rebuilds when a header changes; puts the headers in the sdist
    )
]

setup(
    ext_modules=cythonize(extensions, compiler_directives={"language_level": 3}),
    cmdclass={"build_ext": BuildExt},
)
