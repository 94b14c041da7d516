// loom::checkpoint::MappedFile, is_mapped, unmapped, copy_all, LoadPlan and DeferredChecks
// (include/loom/checkpoint/mapped.hpp).
#include <loom/checkpoint/mapped.hpp>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <cstring>
#include <system_error>
#include <thread>
#include <unordered_map>

#if defined(__x86_64__)
#include <emmintrin.h>
#endif
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/core/grad_mode.h>
#include <c10/core/CPUAllocator.h>
#include <c10/core/Storage.h>

#include <loom/checkpoint/crc32.hpp>
#include <loom/error.hpp>

namespace loom::checkpoint {

namespace {

// The DataPtr context of a mapped storage: it keeps the mapping alive. Its deleter marks the
// storage as mapped (is_mapped compares it).
void release_mapping(void* ctx) { delete static_cast<std::shared_ptr<const MappedFile>*>(ctx); }

}  // namespace

std::shared_ptr<const MappedFile> MappedFile::open(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return nullptr;
  struct stat st {};
  void* base = MAP_FAILED;
  std::size_t size = 0;
  if (::fstat(fd, &st) == 0 && S_ISREG(st.st_mode) && st.st_size > 0) {
    size = static_cast<std::size_t>(st.st_size);
    // PROT_WRITE on a private mapping: a write copies the page and never reaches the file, so a
    // tensor of it behaves as one in its own memory would.
    base = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE, fd, 0);
  }
  ::close(fd);  // the mapping stays valid without the descriptor
  if (base == MAP_FAILED) return nullptr;
  return std::shared_ptr<const MappedFile>(new MappedFile(base, size));
}

MappedFile::~MappedFile() { ::munmap(base_, size_); }

at::Tensor MappedFile::bytes(std::size_t offset, std::size_t n, const std::string& what) const {
  if (offset > size_ || n > size_ - offset) {
    throw Error("loom::checkpoint: " + what + ": a record of " + std::to_string(n) +
                " bytes at offset " + std::to_string(offset) + " lies beyond the end of the " +
                std::to_string(size_) + "-byte file (truncated or corrupted)");
  }
  auto* data = static_cast<char*>(base_) + offset;
  auto* keep = new std::shared_ptr<const MappedFile>(shared_from_this());
  c10::Storage storage(c10::Storage::use_byte_size_t(), n,
                       c10::DataPtr(data, keep, &release_mapping, c10::Device(c10::kCPU)),
                       /*allocator=*/nullptr, /*resizable=*/false);
  return at::empty({0}, at::TensorOptions(at::kByte))
      .set_(std::move(storage), 0, {static_cast<int64_t>(n)}, {1});
}

bool is_mapped(const at::Tensor& t) noexcept {
  return t.defined() && t.has_storage() && t.storage().data_ptr().get_deleter() == &release_mapping;
}

namespace {

class Unmapper {
 public:
  c10::IValue operator()(const c10::IValue& v) {
    if (v.isTensor()) return tensor(v.toTensor());
    if (v.isGenericDict()) {
      auto d = v.toGenericDict();
      for (auto it = d.begin(); it != d.end(); ++it) {
        if (holds_tensors(it->value())) it->setValue((*this)(it->value()));
      }
      return v;
    }
    if (v.isList()) {
      auto l = v.toList();
      for (std::size_t i = 0; i < l.size(); ++i) {
        const c10::IValue e = l.get(i);
        if (holds_tensors(e)) l.set(i, (*this)(e));
      }
      return v;
    }
    if (v.isTuple()) {
      const auto& elements = v.toTupleRef().elements();
      std::vector<c10::IValue> out;
      out.reserve(elements.size());
      bool changed = false;
      for (const auto& e : elements) {
        out.push_back((*this)(e));
        changed = changed || !out.back().isSameIdentity(e);
      }
      return changed ? c10::IValue(c10::ivalue::Tuple::create(std::move(out))) : v;
    }
    return v;
  }

 private:
  static bool holds_tensors(const c10::IValue& v) {
    return v.isTensor() || v.isGenericDict() || v.isList() || v.isTuple();
  }
  c10::IValue tensor(const at::Tensor& t) {
    if (!is_mapped(t)) return t;
    const c10::Storage& from = t.storage();
    auto it = copies_.find(from.unsafeGetStorageImpl());
    if (it == copies_.end()) {
      c10::Storage own(c10::Storage::use_byte_size_t(), from.nbytes(),
                       c10::GetDefaultCPUAllocator(),
                       /*resizable=*/true);
      if (from.nbytes() > 0) std::memcpy(own.mutable_data(), from.data(), from.nbytes());
      it = copies_.emplace(from.unsafeGetStorageImpl(), std::move(own)).first;
    }
    at::Tensor out =
        at::empty({0}, t.options()).set_(it->second, t.storage_offset(), t.sizes(), t.strides());
    if (t.requires_grad()) out.requires_grad_(true);
    return out;
  }

  std::unordered_map<const c10::StorageImpl*, c10::Storage> copies_;
};

}  // namespace

c10::IValue unmapped(const c10::IValue& value) { return Unmapper{}(value); }

namespace {

// Copies n bytes with streaming (non-temporal) stores where the CPU has them: the destination's
// lines are written without being read first (a third less memory traffic than memcpy) and
// leave the cache to the source's, which the CRC-32 that follows reads again.
void stream_copy(char* dst, const char* src, std::size_t n) {
#if defined(__x86_64__)
  // SSE2 is part of x86-64: no dispatch needed. Align the destination to 16 bytes first.
  const auto head =
      std::min<std::size_t>(n, (16 - reinterpret_cast<std::uintptr_t>(dst) % 16) % 16);
  std::memcpy(dst, src, head);
  std::size_t i = head;
  for (; i + 64 <= n; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 32));
    const __m128i d = _mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(dst + i + 48), d);
  }
  std::memcpy(dst + i, src + i, n - i);
  _mm_sfence();  // the streamed lines are visible before anyone reads them
#else
  std::memcpy(dst, src, n);
#endif
}

thread_local DeferredChecks* t_current = nullptr;
thread_local KeepMapped* t_keep = nullptr;

// Whether `dst` may take `src`'s mapped pages as its memory (KeepMapped): nothing else sees
// dst's memory, it is all of it, and the two hold the same bytes in the same layout.
bool may_keep_mapped(const at::Tensor& dst, const at::Tensor& src) {
  if (!src.has_storage() || !is_mapped(src) || !dst.has_storage() || !dst.device().is_cpu() ||
      !src.device().is_cpu() || dst.layout() != at::kStrided || src.layout() != at::kStrided ||
      dst.scalar_type() != src.scalar_type() || dst.sizes() != src.sizes() ||
      !dst.is_contiguous() || !src.is_contiguous() || dst.is_conj() || src.is_conj() ||
      dst.is_neg() || src.is_neg() || dst.is_quantized()) {
    return false;
  }
  const auto item = static_cast<std::uintptr_t>(src.element_size());
  return dst.storage().use_count() == 1 && dst.storage_offset() == 0 &&
         dst.storage().nbytes() == dst.nbytes() &&
         reinterpret_cast<std::uintptr_t>(src.const_data_ptr()) % item == 0;
}

// Whether dst.copy_(src) is a plain copy of nbytes contiguous CPU bytes.
bool plain_copy(const at::Tensor& dst, const at::Tensor& src) {
  return dst.device().is_cpu() && src.device().is_cpu() && dst.layout() == at::kStrided &&
         src.layout() == at::kStrided && dst.scalar_type() == src.scalar_type() &&
         dst.sizes() == src.sizes() && dst.is_contiguous() && src.is_contiguous() &&
         !dst.is_conj() && !src.is_conj() && !dst.is_neg() && !src.is_neg() &&
         !dst.is_quantized() && dst.has_storage() && src.has_storage() &&
         !dst.storage().is_alias_of(src.storage());
}

}  // namespace

void copy_all(const TensorCopies& copies) {
  at::NoGradGuard no_grad;
  DeferredChecks* checks = t_current;
  // Pieces small enough that the CRC-32 reads what the copy just brought into the cache.
  constexpr std::size_t piece_bytes = std::size_t{256} << 10;
  struct Piece {
    char* dst;
    const char* src;
    std::size_t n;
    std::size_t record;  // index in checks->records_
    uint32_t crc;
  };
  std::vector<Piece> pieces;
  KeepMapped* keep = KeepMapped::current();
  for (const auto& [dst, src] : copies) {
    if (keep != nullptr && may_keep_mapped(dst, src) &&
        keep->given_.insert(src.storage().unsafeGetStorageImpl()).second) {
      // The file's pages become dst's memory; its record's CRC-32 is left to finish().
      c10::TensorImpl* impl = dst.unsafeGetTensorImpl();
      impl->set_storage_keep_dtype(src.storage());
      impl->set_storage_offset(src.storage_offset());
      impl->bump_version();
      continue;
    }
    const std::size_t record =
        checks != nullptr ? checks->whole_record(src) : DeferredChecks::no_record;
    if (record == DeferredChecks::no_record || !plain_copy(dst, src)) {
      dst.copy_(src);  // a record copied this way is checked by finish()
      continue;
    }
    checks->records_[record].checked = true;  // below, once copied
    auto* d = static_cast<char*>(dst.mutable_data_ptr());
    const auto* s = static_cast<const char*>(src.const_data_ptr());
    const auto n = static_cast<std::size_t>(dst.nbytes());
    for (std::size_t at = 0; at < n; at += piece_bytes) {
      pieces.push_back(Piece{d + at, s + at, std::min(piece_bytes, n - at), record, 0});
    }
    dst.unsafeGetTensorImpl()->bump_version();  // as copy_ does: autograd sees the change
  }
  if (pieces.empty()) return;
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t begin, int64_t end) {
    for (auto i = begin; i < end; ++i) {
      Piece& p = pieces[static_cast<std::size_t>(i)];
      stream_copy(p.dst, p.src, p.n);
      p.crc = detail::crc32(p.src, p.n);
    }
  });
  // A record's pieces are consecutive: their CRCs combine into the record's.
  for (std::size_t i = 0; i < pieces.size();) {
    const std::size_t record = pieces[i].record;
    uint32_t crc = pieces[i].crc;
    for (++i; i < pieces.size() && pieces[i].record == record; ++i) {
      crc = detail::crc32_combine(crc, pieces[i].crc, pieces[i].n);
    }
    const auto& r = checks->records_[record];
    if (crc != r.expected) checks->fail(r);
  }
}

KeepMapped::KeepMapped(bool keep) noexcept : keep_(keep), outer_(t_keep) { t_keep = this; }

KeepMapped::~KeepMapped() { t_keep = outer_; }

KeepMapped* KeepMapped::current() noexcept {
  return t_keep != nullptr && t_keep->keep_ ? t_keep : nullptr;
}

bool LoadPlan::may_adopt(const at::Tensor& source) {
  return source.storage_offset() == 0 && source.storage().use_count() == 1 &&
         source.storage().nbytes() == source.nbytes() && !is_mapped(source);
}

DeferredChecks::DeferredChecks(std::string note) : note_(std::move(note)), outer_(t_current) {
  t_current = this;
}

DeferredChecks::~DeferredChecks() { t_current = outer_; }

DeferredChecks* DeferredChecks::current() noexcept { return t_current; }

void DeferredChecks::defer(std::string what, std::string name, at::Tensor bytes,
                           uint32_t expected) {
  if (expected == 0) return;  // none recorded
  by_data_.insert_or_assign(bytes.const_data_ptr(), records_.size());
  records_.push_back(Record{std::move(what), std::move(name), std::move(bytes), expected});
}

std::size_t DeferredChecks::whole_record(const at::Tensor& src) const {
  if (!is_mapped(src) || !src.is_contiguous()) return no_record;
  const auto it = by_data_.find(src.const_data_ptr());
  if (it == by_data_.end()) return no_record;
  const Record& r = records_[it->second];
  return !r.checked && r.bytes.nbytes() == src.nbytes() ? it->second : no_record;
}

void DeferredChecks::fail(const Record& r) const {
  throw detail::corrupted_record(r.what, r.name, note_);
}

void DeferredChecks::finish() {
  std::vector<const Record*> left;
  std::size_t total = 0;
  for (auto& r : records_) {
    if (r.checked) continue;
    left.push_back(&r);
    total += static_cast<std::size_t>(r.bytes.nbytes());
    r.checked = true;
  }
  std::atomic<std::size_t> next{0};
  std::atomic<std::size_t> failed{left.size()};  // the lowest index that failed
  auto work = [&] {
    for (std::size_t i = next++; i < left.size(); i = next++) {
      const Record& r = *left[i];
      if (detail::crc32(r.bytes.const_data_ptr(), static_cast<std::size_t>(r.bytes.nbytes())) ==
          r.expected) {
        continue;
      }
      std::size_t seen = failed.load();
      while (i < seen && !failed.compare_exchange_weak(seen, i)) {
      }
    }
  };
  std::thread second;
  if (total >= detail::check_aside_bytes && left.size() > 1 &&
      std::thread::hardware_concurrency() >= 2) {
    try {
      second = std::thread(work);
    } catch (const std::system_error&) {
      // no thread: this one checks them all
    }
  }
  work();
  if (second.joinable()) second.join();
  if (failed.load() < left.size()) fail(*left[failed.load()]);
}

}  // namespace loom::checkpoint
