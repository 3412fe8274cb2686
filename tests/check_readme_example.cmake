# Fails unless the document DOC (README.md or a page under docs/) contains the example file
# EXAMPLE verbatim (each documented example is compiled or run as a test, so the document
# must show the same code).
file(READ "${DOC}" doc)
file(READ "${EXAMPLE}" example)
string(FIND "${doc}" "${example}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "${DOC} does not contain ${EXAMPLE} verbatim; update the example in ${DOC}")
endif()
