# Fails unless the README names exactly the Debian packages the project's scripts install or
# test with: the Quick start's list is scripts/install-deps.sh's package list, the Python
# section's is the package list of the minimal root filesystem in which CI builds and tests
# the wheel (scripts/minimal-root.sh). Run with -DSOURCE_DIR=<checkout>.
function(readme_list marker out)
  file(STRINGS "${SOURCE_DIR}/README.md" _lines REGEX "${marker}")
  list(LENGTH _lines _n)
  if(NOT _n EQUAL 1)
    message(FATAL_ERROR "README.md: expected one line matching '${marker}', found ${_n}")
  endif()
  string(REGEX MATCH "`([^`]+)`" _ "${_lines}")
  separate_arguments(_packages UNIX_COMMAND "${CMAKE_MATCH_1}")
  list(SORT _packages)
  set(${out} "${_packages}" PARENT_SCOPE)
endfunction()

function(script_list script flag out)
  execute_process(COMMAND bash "${SOURCE_DIR}/scripts/${script}" ${flag}
                  OUTPUT_VARIABLE _text RESULT_VARIABLE _rc OUTPUT_STRIP_TRAILING_WHITESPACE)
  if(NOT _rc EQUAL 0)
    message(FATAL_ERROR "scripts/${script} ${flag} failed (${_rc})")
  endif()
  separate_arguments(_packages UNIX_COMMAND "${_text}")
  list(SORT _packages)
  set(${out} "${_packages}" PARENT_SCOPE)
endfunction()

readme_list("^- Debian packages: `" readme_quick_start)
script_list(install-deps.sh --list-packages installed)
if(NOT readme_quick_start STREQUAL installed)
  message(FATAL_ERROR "README.md's Quick start lists the Debian packages\n  ${readme_quick_start}\n"
                      "but scripts/install-deps.sh installs\n  ${installed}")
endif()
readme_list("^- Debian packages \\(or your system's equivalents\\): `" readme_python)
script_list(minimal-root.sh --list pip_root)
if(NOT readme_python STREQUAL pip_root)
  message(FATAL_ERROR "README.md's Python section lists the Debian packages\n  ${readme_python}\n"
                      "but CI's pip test runs in a root filesystem holding\n  ${pip_root}")
endif()
message(STATUS "README.md names the packages of install-deps.sh (${readme_quick_start}) and of the pip test's root (${readme_python})")
