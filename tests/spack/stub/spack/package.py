"""Stub of `spack.package`: directives are recorded in DIRECTIVES, in declaration order."""
import contextlib
import os

DIRECTIVES = []


def _directive(name):
    def record(*args, **kwargs):
        DIRECTIVES.append((name, args, kwargs))

    record.__name__ = name
    return record


version = _directive("version")
variant = _directive("variant")
depends_on = _directive("depends_on")
requires = _directive("requires")
conflicts = _directive("conflicts")
extends = _directive("extends")
maintainers = _directive("maintainers")
license = _directive("license")

join_path = os.path.join


# What the stub's executables were asked to run, and what they print: tests set OUTPUT.
CALLS = []
OUTPUT = {"text": ""}


class Executable:
    """Stub of spack's Executable: records (path, args) and returns OUTPUT when asked to."""

    def __init__(self, path):
        self.path = path

    def __call__(self, *args, output=None, error=None):
        CALLS.append((self.path, args))
        if output is str.split or output is str:
            return OUTPUT["text"]
        return None


class Prefix(str):
    """Stub of spack's Prefix: attribute access joins path components."""

    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return Prefix(os.path.join(self, name))


def which(*names):
    return Executable(names[0]) if names else None


WORKING_DIRS = []


@contextlib.contextmanager
def working_dir(path, create=False):
    WORKING_DIRS.append((path, create))
    yield path


__all__ = ["version", "variant", "depends_on", "requires", "conflicts", "extends", "maintainers",
           "license", "join_path", "which", "working_dir", "Prefix", "Executable"]
