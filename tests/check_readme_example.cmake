# Fails unless README.md contains examples/quickstart.cpp verbatim (the README's example
# is compiled and run as a test, so it must stay the same code).
file(READ "${README}" readme)
file(READ "${EXAMPLE}" example)
string(FIND "${readme}" "${example}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "README.md does not contain ${EXAMPLE} verbatim; update the README's example")
endif()
