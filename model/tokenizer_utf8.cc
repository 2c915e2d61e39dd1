#include "model/tokenizer_utf8.h"

#include <vector>

namespace strata::tokenizer_internal {
namespace {

constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

struct ByteTables {
  std::array<std::string, 256> byte_to_char;
  // Indexed by code point (all mapped characters are below U+0144).
  std::array<int16_t, 512> char_to_byte;
};

const ByteTables& Tables() {
  static const ByteTables* tables = [] {
    auto* t = new ByteTables();
    t->char_to_byte.fill(-1);
    // Printable bytes keep their own code point; the rest are numbered from
    // U+0100 upwards in byte order (GPT-2's bytes_to_unicode).
    std::vector<bool> printable(256, false);
    for (int b = '!'; b <= '~'; ++b) printable[b] = true;
    for (int b = 0xA1; b <= 0xAC; ++b) printable[b] = true;
    for (int b = 0xAE; b <= 0xFF; ++b) printable[b] = true;
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const uint32_t cp = printable[b] ? static_cast<uint32_t>(b) : next++;
      AppendUtf8(cp, &t->byte_to_char[b]);
      t->char_to_byte[cp] = static_cast<int16_t>(b);
    }
    return t;
  }();
  return *tables;
}

}  // namespace

size_t FindInvalidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    int need;
    unsigned char lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    } else {
      return i;
    }
    if (i + need >= n) return i;  // truncated
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (int k = 2; k <= need; ++k) {
      if (p[i + k] < 0x80 || p[i + k] > 0xBF) return i;
    }
    i += need + 1;
  }
  return std::string_view::npos;
}

uint32_t DecodeUtf8At(std::string_view s, size_t pos, size_t* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data()) + pos;
  const unsigned char c = p[0];
  if (c < 0x80) {
    *len = 1;
    return c;
  }
  if (c < 0xE0) {
    *len = 2;
    return ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu);
  }
  if (c < 0xF0) {
    *len = 3;
    return ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
  }
  *len = 4;
  return ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) |
         (p[3] & 0x3Fu);
}

uint32_t DecodeLastUtf8(std::string_view s, size_t* len) {
  if (s.empty()) {
    *len = 0;
    return 0;
  }
  size_t start = s.size() - 1;
  while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
  return DecodeUtf8At(s, start, len);
}

void AppendUtf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

bool IsUnicodeWhiteSpace(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  if (cp < 0x85) return false;
  switch (cp) {
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return cp >= 0x2000 && cp <= 0x200A;
  }
}

const std::array<std::string, 256>& ByteToChar() { return Tables().byte_to_char; }

int CharToByte(uint32_t cp) {
  if (cp >= Tables().char_to_byte.size()) return -1;
  return Tables().char_to_byte[cp];
}

void Utf8LossyDecoder::Feed(std::string_view bytes, std::string* out) {
  for (size_t i = 0; i < bytes.size();) {
    const auto b = static_cast<unsigned char>(bytes[i]);
    if (needed_ == 0) {
      ++i;
      if (b < 0x80) {
        out->push_back(static_cast<char>(b));
      } else if (b >= 0xC2 && b <= 0xDF) {
        needed_ = 1;
        cp_ = b & 0x1F;
      } else if (b >= 0xE0 && b <= 0xEF) {
        if (b == 0xE0) lower_ = 0xA0;
        if (b == 0xED) upper_ = 0x9F;
        needed_ = 2;
        cp_ = b & 0x0F;
      } else if (b >= 0xF0 && b <= 0xF4) {
        if (b == 0xF0) lower_ = 0x90;
        if (b == 0xF4) upper_ = 0x8F;
        needed_ = 3;
        cp_ = b & 0x07;
      } else {
        out->append(kReplacement);
      }
      continue;
    }
    if (b < lower_ || b > upper_) {
      // The held prefix is a maximal ill-formed subsequence; this byte starts
      // afresh (it is not consumed here).
      out->append(kReplacement);
      cp_ = 0;
      needed_ = seen_ = 0;
      lower_ = 0x80;
      upper_ = 0xBF;
      continue;
    }
    ++i;
    lower_ = 0x80;
    upper_ = 0xBF;
    cp_ = (cp_ << 6) | (b & 0x3F);
    if (++seen_ == needed_) {
      AppendUtf8(cp_, out);
      cp_ = 0;
      needed_ = seen_ = 0;
    }
  }
}

void Utf8LossyDecoder::Finish(std::string* out) {
  if (needed_ != 0) out->append(kReplacement);
  cp_ = 0;
  needed_ = seen_ = 0;
  lower_ = 0x80;
  upper_ = 0xBF;
}

std::string DecodeUtf8Lossy(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size());
  Utf8LossyDecoder decoder;
  decoder.Feed(bytes, &out);
  decoder.Finish(&out);
  return out;
}

}  // namespace strata::tokenizer_internal
