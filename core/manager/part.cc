#include "core/manager/part.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <memory>
#include <sstream>

#include "core/base/box.h"
#include "core/base/wire.h"
#include "core/format/checksum.h"
#include "core/plan/save_planner.h"

namespace distckpt {
namespace {

// Percent-escapes everything but printable ASCII other than '%' and ' ', so a name is one space-free token.
std::string Escape(std::string_view s) {
  std::string out;
  for (unsigned char c : s) {
    if (c > 0x20 && c < 0x7f && c != '%') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[4];
      std::snprintf(buf, sizeof buf, "%%%02X", c);
      out += buf;
    }
  }
  return out;
}

bool Unescape(std::string_view s, std::string* out) {
  out->clear();
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '%') {
      out->push_back(s[i]);
      continue;
    }
    if (i + 2 >= s.size()) return false;
    auto hex = [](char c) -> int {
      if (c >= '0' && c <= '9') return c - '0';
      if (c >= 'A' && c <= 'F') return c - 'A' + 10;
      return -1;
    };
    int hi = hex(s[i + 1]), lo = hex(s[i + 2]);
    if (hi < 0 || lo < 0) return false;
    out->push_back(static_cast<char>(hi * 16 + lo));
    i += 2;
  }
  return true;
}

std::string Join(const std::vector<uint64_t>& v) {
  std::string s;
  for (size_t i = 0; i < v.size(); ++i) s += (i ? "," : "") + std::to_string(v[i]);
  return s.empty() ? "-" : s;
}

bool ParseNumber(std::string_view s, uint64_t* v) {
  if (s.empty() || s.size() > 20) return false;
  uint64_t r = 0;
  for (char c : s) {
    if (c < '0' || c > '9') return false;
    uint64_t d = static_cast<uint64_t>(c - '0');
    if (r > (UINT64_MAX - d) / 10) return false;
    r = r * 10 + d;
  }
  *v = r;
  return true;
}

bool SplitNumbers(std::string_view s, std::vector<uint64_t>* out) {
  out->clear();
  if (s == "-") return true;
  size_t start = 0;
  while (true) {
    size_t comma = s.find(',', start);
    uint64_t v;
    if (!ParseNumber(s.substr(start, comma == std::string_view::npos ? std::string_view::npos : comma - start), &v)) {
      return false;
    }
    out->push_back(v);
    if (out->size() > kMaxDims) return false;
    if (comma == std::string_view::npos) return true;
    start = comma + 1;
  }
}

std::vector<std::string_view> Tokens(std::string_view line) {
  std::vector<std::string_view> out;
  size_t i = 0;
  while (i < line.size()) {
    size_t j = line.find(' ', i);
    if (j == std::string_view::npos) j = line.size();
    out.push_back(line.substr(i, j - i));
    i = j + 1;
  }
  return out;
}

std::string InfoText(const PartInfo& info) {
  return "rank=" + std::to_string(info.rank) + " ranks=" + std::to_string(info.ranks) +
         " step=" + std::to_string(info.step);
}

Result<PartInfo> ParseInfo(std::string_view text, const std::string& context) {
  PartInfo info;
  uint64_t rank = UINT64_MAX, ranks = UINT64_MAX, step = UINT64_MAX;
  for (std::string_view tok : Tokens(text)) {
    size_t eq = tok.find('=');
    if (eq == std::string_view::npos) break;
    std::string_view k = tok.substr(0, eq), v = tok.substr(eq + 1);
    uint64_t* dst = k == "rank" ? &rank : k == "ranks" ? &ranks : k == "step" ? &step : nullptr;
    if (dst && !ParseNumber(v, dst)) dst = nullptr, rank = UINT64_MAX;
  }
  if (rank == UINT64_MAX || ranks == UINT64_MAX || step == UINT64_MAX || ranks == 0 || ranks > (1u << 24) ||
      rank >= ranks) {
    return Corrupt(context + ": user key '" + kPartKey + "' is not a part description: '" + std::string(text) + "'");
  }
  info.rank = static_cast<uint32_t>(rank);
  info.ranks = static_cast<uint32_t>(ranks);
  info.step = step;
  return info;
}

}  // namespace

Result<State> MakePartState(const State& state, const PartInfo& info) {
  State part;
  std::string boxes;
  for (const TensorEntry& t : state.tensors()) {
    for (size_t k = 0; k < t.pieces.size(); ++k) {
      const TensorPiece& p = t.pieces[k];
      const uint32_t nd = p.box.ndim;
      std::vector<uint64_t> offsets(p.box.offset, p.box.offset + nd), lengths(p.box.length, p.box.length + nd);
      const std::string entry = t.name + "#" + std::to_string(k);
      DCKPT_RETURN_IF_ERROR(part.AddTensor(entry, t.dtype, lengths));
      std::vector<uint64_t> zeros(nd, 0);
      DCKPT_RETURN_IF_ERROR(part.AddPieceIn(entry, zeros, lengths, p.data, p.memory));
      boxes += Escape(entry) + " " + Escape(t.name) + " " + Join(offsets) + " " + Join(t.shape) + "\n";
    }
  }
  for (const BytesEntry& b : state.bytes()) {
    DCKPT_RETURN_IF_ERROR(part.AddConstBytes(b.name, b.data, b.size));
  }
  for (const auto& kv : state.user()) part.SetUserMetadata(kv.first, kv.second);
  part.SetUserMetadata(kPartKey, InfoText(info));
  part.SetUserMetadata(kPartBoxesKey, boxes);
  if (!state.structure().empty()) part.SetUserMetadata(kPartStructureKey, state.structure());
  return part;
}

std::string EncodeLayout(const State& state) {
  WireWriter w;
  w.Var(state.tensors().size());
  for (const TensorEntry& t : state.tensors()) {
    w.Str(t.name);
    w.Var(static_cast<uint64_t>(t.dtype));
    w.Var(t.shape.size());
    for (uint64_t d : t.shape) w.Var(d);
    w.Var(t.pieces.size());
    for (const TensorPiece& p : t.pieces) {
      for (uint32_t d = 0; d < t.shape.size(); ++d) {
        w.Var(p.box.offset[d]);
        w.Var(p.box.length[d]);
      }
    }
  }
  return w.Take();
}

Status CheckLayouts(const std::vector<std::string>& layouts, const std::string& context) {
  struct Tensor {
    uint64_t dtype = 0;
    std::vector<uint64_t> shape;
    int first_rank = 0;
    std::map<std::vector<uint64_t>, int> boxes;  // offsets ++ lengths -> a rank that holds it
  };
  std::map<std::string, Tensor> tensors;
  for (size_t r = 0; r < layouts.size(); ++r) {
    WireReader rd(layouts[r]);
    uint64_t n = 0;
    bool ok = rd.Count(&n, 4);
    for (uint64_t i = 0; ok && i < n; ++i) {
      std::string name;
      uint64_t dtype = 0, ndim = 0, pieces = 0;
      ok = rd.Str(&name) && rd.Var(&dtype) && rd.Count(&ndim, 1) && ndim <= kMaxDims;
      std::vector<uint64_t> shape(ok ? ndim : 0);
      for (uint64_t d = 0; ok && d < ndim; ++d) ok = rd.Var(&shape[d]);
      ok = ok && rd.Count(&pieces, 2 * ndim);
      if (!ok) break;
      auto [it, fresh] = tensors.try_emplace(name);
      Tensor& t = it->second;
      if (fresh) {
        t.dtype = dtype, t.shape = shape, t.first_rank = static_cast<int>(r);
      } else if (t.dtype != dtype || t.shape != shape) {
        return InvalidArgument(context + ": tensor '" + name + "' has another dtype or shape on rank " +
                               std::to_string(r) + " than on rank " + std::to_string(t.first_rank));
      }
      for (uint64_t p = 0; ok && p < pieces; ++p) {
        std::vector<uint64_t> key(2 * ndim);
        for (uint64_t d = 0; ok && d < ndim; ++d) ok = rd.Var(&key[d]) && rd.Var(&key[ndim + d]);
        if (ok) t.boxes.emplace(key, static_cast<int>(r));
      }
    }
    if (!ok) return Internal(context + ": malformed layout from rank " + std::to_string(r));
  }
  for (const auto& [name, t] : tensors) {
    std::vector<Box> boxes;
    const size_t nd = t.shape.size();
    for (const auto& kv : t.boxes) {
      auto box = Box::Make(Span<const uint64_t>(kv.first.data(), nd), Span<const uint64_t>(kv.first.data() + nd, nd));
      if (!box.ok()) return InvalidArgument(context + ": tensor '" + name + "': " + box.status().message());
      boxes.push_back(box.value());
    }
    Status tiled = CheckExactTiling(Span<const uint64_t>(t.shape.data(), nd), boxes);
    if (!tiled.ok()) {
      return InvalidArgument(
          context + ": the ranks' pieces of tensor '" + name +
          "' do not tile it exactly (every element in one box; replicas in identical boxes): " + tiled.message());
    }
  }
  return OkStatus();
}

Result<PartInfo> PartInfoOf(const MetadataView& view, const std::string& context) {
  auto text = view.FindUser(kPartKey);
  if (!text) return Corrupt(context + ": not a part of a managed step (no user key '" + kPartKey + "')");
  return ParseInfo(*text, context);
}

Result<Part> ParsePart(const std::string& metadata_bytes, const std::string& context) {
  DCKPT_ASSIGN_OR_RETURN(MetadataView view,
                         MetadataView::Parse(std::make_shared<const std::string>(metadata_bytes), context));
  Part part;
  DCKPT_ASSIGN_OR_RETURN(part.info, PartInfoOf(view, context));
  part.record = view.ToRecord();
  std::string_view boxes = view.FindUser(kPartBoxesKey).value_or("");
  std::map<std::string, size_t> listed;
  size_t pos = 0;
  while (pos < boxes.size()) {
    size_t nl = boxes.find('\n', pos);
    if (nl == std::string_view::npos) nl = boxes.size();
    std::string_view line = boxes.substr(pos, nl - pos);
    pos = nl + 1;
    auto bad = [&](const std::string& why) {
      return Corrupt(context + ": user key '" + kPartBoxesKey + "': line '" + std::string(line.substr(0, 200)) +
                     "': " + why);
    };
    std::vector<std::string_view> tok = Tokens(line);
    Part::Piece piece;
    if (tok.size() != 4 || !Unescape(tok[0], &piece.entry) || !Unescape(tok[1], &piece.tensor) ||
        !SplitNumbers(tok[2], &piece.offsets) || !SplitNumbers(tok[3], &piece.shape)) {
      return bad("malformed");
    }
    auto idx = view.Find(piece.entry);
    if (!idx) return bad("names no entry of the part");
    EntryView e = view.entry(*idx);
    if (e.kind != EntryKind::kTensor) return bad("names a bytes entry");
    if (e.ndim() != piece.shape.size() || piece.offsets.size() != piece.shape.size()) {
      return bad("dimensions do not match the entry's");
    }
    for (uint32_t d = 0; d < e.ndim(); ++d) {
      if (piece.offsets[d] > piece.shape[d] || e.shape[d] > piece.shape[d] - piece.offsets[d]) {
        return bad("the piece does not lie inside the tensor's shape");
      }
    }
    if (!listed.emplace(piece.entry, part.pieces.size()).second) return bad("lists an entry twice");
    part.pieces.push_back(std::move(piece));
  }
  for (size_t i = 0; i < view.num_entries(); ++i) {
    EntryView e = view.entry(i);
    if (e.kind == EntryKind::kTensor && !listed.count(std::string(e.name))) {
      return Corrupt(context + ": tensor entry '" + std::string(e.name) +
                     "' of the part is not placed in any "
                     "tensor (user key '" +
                     kPartBoxesKey + "')");
    }
  }
  return part;
}

Result<std::string> MergeParts(const std::vector<Part>& parts, const std::string& context,
                               const std::function<std::string(const std::string&)>& file_name) {
  if (parts.empty()) return InvalidArgument(context + ": no parts to merge");
  std::vector<const Part*> order;
  for (const Part& p : parts) order.push_back(&p);
  std::sort(order.begin(), order.end(), [](const Part* a, const Part* b) { return a->info.rank < b->info.rank; });
  const uint32_t ranks = order[0]->info.ranks;
  for (size_t i = 0; i < order.size(); ++i) {
    const PartInfo& info = order[i]->info;
    if (info.ranks != ranks || info.step != order[0]->info.step || info.rank != i) {
      return Corrupt(context + ": the parts do not make up one step of one job (part " + InfoText(info) + " beside " +
                     InfoText(order[0]->info) + ", " + std::to_string(order.size()) + " parts)");
    }
    if (order[i]->record.checksum_block_size != order[0]->record.checksum_block_size) {
      return Corrupt(context + ": parts of rank 0 and rank " + std::to_string(i) +
                     " have different checksum block sizes");
    }
  }
  if (order.size() != ranks) {
    return NotFound(context + ": " + std::to_string(order.size()) + " of " + std::to_string(ranks) + " parts");
  }

  MetadataRecord out;
  const MetadataRecord& first = order[0]->record;
  out.writer = first.writer;
  out.checksum_block_size = first.checksum_block_size;
  out.alignment = first.alignment;
  for (const auto& kv : first.user) {
    if (kv.first == kPartStructureKey) out.structure = kv.second;
    else if (kv.first != kPartKey && kv.first != kPartBoxesKey) out.user.push_back(kv);
  }

  // Data files: the parts' own first, numbered in rank order, then each base file once.
  uint32_t own_total = 0;
  for (const Part* part : order) {
    for (const DataFileRecord& f : part->record.files) own_total += f.base == 0 ? 1 : 0;
  }
  std::map<std::string, uint32_t> base_index;                      // name -> 1-based index in out.bases
  std::map<std::pair<uint32_t, std::string>, uint32_t> base_file;  // (base, name) -> index in out.files
  std::vector<DataFileRecord> base_files;
  std::vector<std::vector<uint32_t>> file_map(order.size());  // per part: its file index -> the merged one
  for (size_t i = 0; i < order.size(); ++i) {
    const MetadataRecord& rec = order[i]->record;
    const std::string whose = "the part of rank " + std::to_string(order[i]->info.rank);
    for (const BaseRecord& b : rec.bases) {
      auto [it, added] = base_index.emplace(b.name, static_cast<uint32_t>(out.bases.size() + 1));
      if (added) {
        out.bases.push_back(b);
      } else if (out.bases[it->second - 1].metadata_checksum != b.metadata_checksum ||
                 out.bases[it->second - 1].metadata_size != b.metadata_size) {
        return Corrupt(context + ": " + whose + " refers to another checkpoint named '" + b.name +
                       "' than an earlier part");
      }
    }
    if (!rec.bases.empty()) out.chain_length = std::max(out.chain_length, rec.chain_length);
    for (const DataFileRecord& f : rec.files) {
      if (f.base == 0) {
        const std::string name = DataFileName(static_cast<uint32_t>(out.files.size()));
        file_map[i].push_back(static_cast<uint32_t>(out.files.size()));
        out.files.push_back({file_name ? file_name(name) : name, f.size});
        continue;
      }
      if (f.base > rec.bases.size()) {
        return Corrupt(context + ": " + whose + ": data file '" + f.name + "' names base " + std::to_string(f.base) +
                       " of " + std::to_string(rec.bases.size()));
      }
      const uint32_t merged = base_index.at(rec.bases[f.base - 1].name);
      auto [it, added] = base_file.emplace(std::make_pair(merged, f.name), own_total + base_files.size());
      if (added) base_files.push_back(DataFileRecord{f.name, f.size, merged});
      file_map[i].push_back(it->second);
    }
  }
  out.files.insert(out.files.end(), base_files.begin(), base_files.end());
  const uint64_t block = out.checksum_block_size;

  struct Merged {
    EntryRecord rec;
    std::map<std::vector<uint64_t>, uint32_t> boxes;  // offsets ++ lengths -> rank that holds it
    bool hashless = false;                            // some chunk has no hash: the entry keeps none
    bool coded = false;                               // some chunk is compressed: the entry keeps codings
  };
  std::map<std::string, Merged> tensors;
  std::map<std::string, std::pair<EntryRecord, uint32_t>> bytes;
  for (size_t i = 0; i < order.size(); ++i) {
    const Part* part = order[i];
    const uint32_t rank = part->info.rank;
    const std::vector<uint32_t>& files = file_map[i];
    auto merged_file = [&](const std::string& entry, uint32_t f) -> Result<uint32_t> {
      if (f >= files.size()) {
        return Corrupt(context + ": entry '" + entry + "' of the part of rank " + std::to_string(rank) +
                       " names data file " + std::to_string(f) + " of " + std::to_string(files.size()));
      }
      return files[f];
    };
    std::map<std::string, const Part::Piece*> placed;
    for (const Part::Piece& p : part->pieces) placed[p.entry] = &p;
    for (const EntryRecord& e : part->record.entries) {
      if (e.kind == EntryKind::kBytes) {
        if (e.chunks.at(0).file == kChunkNotWritten) continue;
        auto it = bytes.find(e.name);
        if (it == bytes.end()) {
          EntryRecord r = e;
          for (ChunkLocation& c : r.chunks) {
            DCKPT_ASSIGN_OR_RETURN(c.file, merged_file(e.name, c.file));
          }
          bytes.emplace(e.name, std::make_pair(std::move(r), rank));
        } else if (it->second.first.chunks.at(0).length != e.chunks.at(0).length) {
          return Corrupt(context + ": bytes entry '" + e.name + "' has " +
                         std::to_string(it->second.first.chunks[0].length) + " bytes in the part of rank " +
                         std::to_string(it->second.second) + " but " + std::to_string(e.chunks[0].length) +
                         " in the part of rank " + std::to_string(rank));
        }
        continue;
      }
      const Part::Piece* piece = placed.at(e.name);  // ParsePart checked every tensor entry is placed
      const size_t nd = piece->shape.size();
      auto [it, fresh] = tensors.try_emplace(piece->tensor);
      Merged& m = it->second;
      if (fresh) {
        m.rec.name = piece->tensor;
        m.rec.kind = EntryKind::kTensor;
        m.rec.dtype = e.dtype;
        m.rec.shape = piece->shape;
      } else if (m.rec.dtype != e.dtype || m.rec.shape != piece->shape) {
        return Corrupt(context + ": tensor '" + piece->tensor + "' has another dtype or shape in the part of rank " +
                       std::to_string(rank) + " than in an earlier part");
      }
      const std::string whose = ": tensor '" + piece->tensor + "': ";
      const size_t nchunks = e.chunks.size();
      for (size_t c = 0; c < nchunks; ++c) {
        ChunkLocation loc = e.chunks[c];
        if (loc.file == kChunkNotWritten) continue;  // another part's copy of the box is kept
        std::vector<uint64_t> key;
        for (size_t d = 0; d < nd; ++d) key.push_back(e.chunk_offsets[c * nd + d] + piece->offsets[d]);
        for (size_t d = 0; d < nd; ++d) key.push_back(e.chunk_lengths[c * nd + d]);
        if (!m.boxes.emplace(key, rank).second) continue;  // replicated: the lower rank's copy is kept
        for (size_t d = 0; d < nd; ++d) m.rec.chunk_offsets.push_back(key[d]);
        for (size_t d = 0; d < nd; ++d) m.rec.chunk_lengths.push_back(key[nd + d]);
        DCKPT_ASSIGN_OR_RETURN(loc.file, merged_file(e.name, loc.file));
        const uint64_t blocks = NumChecksumBlocks(loc.length, block);
        if (loc.first_block != kNoBlockTable) {
          // The chunk's block checksums run from first_block to the next chunk's (or the table's end).
          if (loc.first_block > e.block_checksums.size() || blocks > e.block_checksums.size() - loc.first_block) {
            return Corrupt(context + whose + "block table of the part of rank " + std::to_string(rank) + " is short");
          }
          const uint32_t at = static_cast<uint32_t>(m.rec.block_checksums.size());
          m.rec.block_checksums.insert(m.rec.block_checksums.end(), e.block_checksums.begin() + loc.first_block,
                                       e.block_checksums.begin() + loc.first_block + blocks);
          loc.first_block = at;
        }
        m.rec.chunks.push_back(loc);
        if (c < e.chunk_hashes.size()) m.rec.chunk_hashes.push_back(e.chunk_hashes[c]);
        else m.hashless = true;
        ChunkCoding coding;
        coding.stored_length = loc.length;
        if (c < e.codings.size() && !e.codings[c].raw()) {
          coding = e.codings[c];
          if (coding.first_stored > e.stored_blocks.size() || blocks > e.stored_blocks.size() - coding.first_stored) {
            return Corrupt(context + whose + "stored blocks of the part of rank " + std::to_string(rank) +
                           " are short");
          }
          const uint32_t at = static_cast<uint32_t>(m.rec.stored_blocks.size());
          m.rec.stored_blocks.insert(m.rec.stored_blocks.end(), e.stored_blocks.begin() + coding.first_stored,
                                     e.stored_blocks.begin() + coding.first_stored + blocks);
          coding.first_stored = at;
          m.coded = true;
        }
        m.rec.codings.push_back(coding);
      }
    }
  }
  for (auto& kv : tensors) {
    Merged& m = kv.second;
    if (m.hashless) m.rec.chunk_hashes.clear();
    if (!m.coded) m.rec.codings.clear();
  }
  for (auto& kv : tensors) out.entries.push_back(std::move(kv.second.rec));
  for (auto& kv : bytes) out.entries.push_back(std::move(kv.second.first));
  DCKPT_ASSIGN_OR_RETURN(std::string encoded, EncodeMetadata(std::move(out)));
  // The same checks as any reader's: the parts must tile every tensor.
  auto shared = std::make_shared<const std::string>(encoded);
  DCKPT_RETURN_IF_ERROR(MetadataView::Parse(shared, context).status());
  return encoded;
}

}  // namespace distckpt
