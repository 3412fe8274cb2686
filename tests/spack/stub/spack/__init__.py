"""A minimal stand-in for spack's package API, enough to import and exercise kvmap's recipe.

Spack itself cannot be installed on the machines kvmap is tested on; this stub records the
directives a recipe declares and mimics the few objects cmake_args() touches.
"""
