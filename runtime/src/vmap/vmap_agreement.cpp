#include "vmap_agreement.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>

#include "kvmap/dtype.hpp"
#include "kvmap/error.hpp"
#include "hash.hpp"
#include "mpi_transport.hpp"

namespace kvmap::Detail {

std::string describe(const OutputMeta& m) {
  std::ostringstream os;
  os << "per-sample shape " << to_string(Shape(m.shape, m.shape + m.ndim)) << " and dtype "
     << name(dtype_from_int(m.dtype));
  return os.str();
}

std::uint64_t fingerprint(const std::vector<OutputMeta>& metas) {
  std::uint64_t h = combine64(0x6f757470757473ull, metas.size());
  for (const OutputMeta& m : metas) {
    h = combine64(h, static_cast<std::uint64_t>(m.ndim) << 40 |
                         static_cast<std::uint64_t>(m.dtype) << 20 |
                         static_cast<std::uint64_t>(m.out_dim));
    for (int d = 0; d < m.ndim; ++d) h = combine64(h, static_cast<std::uint64_t>(m.shape[d]));
  }
  return h;
}

void encode(const std::vector<OutputMeta>& metas, VmapAgreement& a) {
  std::uint64_t word0 = metas.size() + 1;
  bool fits = metas.size() <= static_cast<std::size_t>(VmapAgreement::kInlineOutputs);
  int w = 1;
  for (std::size_t k = 0; k < metas.size() && fits; ++k) {
    const OutputMeta& m = metas[k];
    word0 |= static_cast<std::uint64_t>(m.dtype | m.ndim << 4 | m.out_dim << 8) << (20 + 12 * k);
    for (int d = 0; d < m.ndim; ++d) {
      if (w == VmapAgreement::kWords) {
        fits = false;
        break;
      }
      a.held.words[w++] = static_cast<std::uint64_t>(m.shape[d]);
    }
  }
  if (!fits) word0 |= 1ull << 16;
  a.held.words[0] = word0;
}

std::size_t agreed_output_count(const VmapAgreement& a) {
  const std::uint64_t counted = a.held.words[0] & 0xffff;  // outputs + 1 where f ran
  return counted == 0 ? 0 : static_cast<std::size_t>(counted - 1);
}

// The outputs' metadata from the reduced words; nullopt when it did not fit.
std::optional<std::vector<OutputMeta>> decode(const VmapAgreement& a) {
  const std::uint64_t word0 = a.held.words[0];
  if (word0 & (1ull << 16)) return std::nullopt;
  std::vector<OutputMeta> metas(static_cast<std::size_t>((word0 & 0xffff) - 1));
  int w = 1;
  for (std::size_t k = 0; k < metas.size(); ++k) {
    OutputMeta& m = metas[k];
    std::memset(&m, 0, sizeof m);
    const std::uint64_t bits = word0 >> (20 + 12 * k);
    m.dtype = static_cast<std::int32_t>(bits & 0xf);
    m.ndim = static_cast<std::int32_t>(bits >> 4 & 0xf);
    m.out_dim = static_cast<std::int32_t>(bits >> 8 & 0xf);
    for (int d = 0; d < m.ndim; ++d) m.shape[d] = static_cast<std::int64_t>(a.held.words[w++]);
  }
  return metas;
}

void raise_different_outputs(const Comm& comm, bool ran, const std::vector<OutputMeta>& mine,
                             const char* who) {
  RankStatus status;
  status.takes_part = ran ? 1 : 0;
  status.key = fingerprint(mine);
  const std::vector<RankStatus> all = gather_statuses(comm, status);
  const int ref = first_taking_part(all);
  const std::vector<int> differing =
      ref < comm.size() ? ranks_differing(all, ref) : std::vector<int>{};
  if (differing.empty()) {
    throw Error(std::string(who) +
                ": internal error: the outputs' agreement failed but no rank "
                "differs");
  }
  // Only the ranks that ran f see their outputs: every rank throws the same ValueError.
  raise_differing(
      comm, ref, differing, ran ? bytes_of(mine) : std::string(),
      [&](int other, const std::string& theirs, const std::string& reference) {
        const std::vector<OutputMeta> a = vector_from_bytes<OutputMeta>(reference),
                                      b = vector_from_bytes<OutputMeta>(theirs);
        std::ostringstream os;
        os << who << ": the function's outputs differ between ranks: rank " << ref << " returned "
           << a.size() << " output(s)";
        for (const auto& m : a) os << " [" << describe(m) << "]";
        os << ", rank " << other << " returned " << b.size();
        for (const auto& m : b) os << " [" << describe(m) << "]";
        return os.str();
      },
      Blame::EveryRank);
}

std::vector<OutputMeta> agreed_outputs(const Comm& comm, const VmapAgreement& agreed,
                                       const Layout& lead, bool ran,
                                       const std::vector<OutputMeta>& mine) {
  const bool everyone_ran =
      lead.gshape()[*lead.split()] == 0 || lead.ranks_with_rows() == comm.size();
  if (ran) {
    // A rank with samples still joins the broadcast that ranks without need.
    if (!everyone_ran && !decode(agreed)) {
      std::vector<OutputMeta> copy = mine;
      Detail::transport(comm).bcast_bytes(copy.data(), copy.size() * sizeof(OutputMeta),
                                          lead.owner(0));
    }
    return mine;
  }
  if (std::optional<std::vector<OutputMeta>> metas = decode(agreed)) return *metas;
  std::vector<OutputMeta> metas(static_cast<std::size_t>((agreed.held.words[0] & 0xffff) - 1));
  Detail::transport(comm).bcast_bytes(metas.data(), metas.size() * sizeof(OutputMeta),
                                      lead.owner(0));
  return metas;
}

}  // namespace kvmap::Detail
