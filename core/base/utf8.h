// UTF-8 validation for text from untrusted input (metadata names, foreign headers).
#ifndef DISTCKPT_CORE_BASE_UTF8_H_
#define DISTCKPT_CORE_BASE_UTF8_H_

#include <string_view>

namespace distckpt {

/// True if `s` is valid UTF-8: no overlong forms, no surrogates, nothing above U+10FFFF, no truncated sequence.
bool IsValidUtf8(std::string_view s);

}  // namespace distckpt

#endif  // DISTCKPT_CORE_BASE_UTF8_H_
