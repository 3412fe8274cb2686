#pragma once
// kvmap::Detail holds what kvmap does not install: the code of runtime/src and its private
// headers (runtime/src/<layer>/). kvmap::Impl holds what the installed headers need
// (kvmap/impl/*.hpp and the Impl blocks of the public headers): installed, not API. A name's
// namespace says whether it ships. The private code builds on the installed implementation.
namespace kvmap::Impl {}

namespace kvmap::Detail {
using namespace kvmap::Impl;
}  // namespace kvmap::Detail
