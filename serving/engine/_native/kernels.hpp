// The scans a search step makes over a row of log-probs: the maximum of a block (SSE2 everywhere, AVX2 where the CPU
// has it, chosen once at load), the arg-max of a row, the k best candidates of a sentence's beams, and the order of a
// few scores. Every result is the one numpy gives (serving/decoding/topk.py): a maximum is exact whatever the vector
// width, and ties go to the lower index.
#pragma once

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string_view>
#include <vector>

namespace mtgate {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// --------------------------------------------------------------------------------------------- block maximum
// maxps(x, m) is "x > m ? x : m" lane by lane, the scalar comparison below: the same maximum in any order (a NaN is
// skipped; 0.0 and -0.0 compare equal, so which of them comes back changes no decision that uses it).

#if defined(__x86_64__) || defined(__i386__)
inline float block_max_sse2(const float* x, int64_t n) {
    __m128 m = _mm_set1_ps(kNegInf);
    int64_t i = 0;
    for (; i + 4 <= n; i += 4) m = _mm_max_ps(_mm_loadu_ps(x + i), m);
    alignas(16) float lanes[4];
    _mm_store_ps(lanes, m);
    float best = lanes[0];
    for (int j = 1; j < 4; ++j) best = lanes[j] > best ? lanes[j] : best;
    for (; i < n; ++i) best = x[i] > best ? x[i] : best;
    return best;
}

__attribute__((target("avx2"))) inline float block_max_avx2(const float* x, int64_t n) {
    __m256 m = _mm256_set1_ps(kNegInf);
    int64_t i = 0;
    for (; i + 8 <= n; i += 8) m = _mm256_max_ps(_mm256_loadu_ps(x + i), m);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, m);
    float best = lanes[0];
    for (int j = 1; j < 8; ++j) best = lanes[j] > best ? lanes[j] : best;
    for (; i < n; ++i) best = x[i] > best ? x[i] : best;
    return best;
}

inline bool has_avx2() { return __builtin_cpu_supports("avx2"); }
#else  // another architecture: the scalar loop under both names
inline float block_max_sse2(const float* x, int64_t n) {
    float best = kNegInf;
    for (int64_t i = 0; i < n; ++i) best = x[i] > best ? x[i] : best;
    return best;
}
inline float block_max_avx2(const float* x, int64_t n) { return block_max_sse2(x, n); }
inline bool has_avx2() { return false; }
#endif

using BlockMax = float (*)(const float*, int64_t);

inline BlockMax& block_max_kernel() {
    static BlockMax kernel = has_avx2() ? block_max_avx2 : block_max_sse2;
    return kernel;
}

inline float block_max(const float* x, int64_t n) { return block_max_kernel()(x, n); }

inline const char* block_max_name() { return block_max_kernel() == block_max_avx2 ? "avx2" : "sse2"; }

// Selects the kernel (tests and measurements compare them): "avx2" (when the CPU has it) or "sse2".
inline bool use_kernel(const char* name) {
    if (name == std::string_view("sse2")) {
        block_max_kernel() = block_max_sse2;
        return true;
    }
    if (name == std::string_view("avx2") && has_avx2()) {
        block_max_kernel() = block_max_avx2;
        return true;
    }
    return false;
}

// --------------------------------------------------------------------------------------------- arg-max
constexpr int64_t kArgmaxBlock = 64;

// numpy's argmax: the first index of the largest entry (log-probs are never NaN).
inline int64_t argmax(const float* row, int64_t width) {
    float best = row[0];
    int64_t at = 0;
    for (int64_t start = 0; start < width; start += kArgmaxBlock) {
        const int64_t n = std::min(kArgmaxBlock, width - start);
        const float top = block_max(row + start, n);
        if (!(top > best)) continue;
        for (int64_t i = start; i < start + n; ++i) {
            if (row[i] == top) {
                best = top;
                at = i;
                break;
            }
        }
    }
    return at;
}

// --------------------------------------------------------------------------------------------- the k best
struct Candidate {
    float score;
    int64_t index;
};

// The k best (score, index) pairs offered, best first. Offered in ascending index order, a pair equal to the worst
// kept one is refused: ties go to the lower index, as a stable sort orders them.
class TopK {
   public:
    void reset(int64_t k) {
        k_ = k;
        size_ = 0;
        items_.resize(static_cast<size_t>(k));
    }
    bool full() const { return size_ == k_; }
    float worst() const { return items_[size_ - 1].score; }
    int64_t size() const { return size_; }
    const Candidate& operator[](int64_t i) const { return items_[i]; }

    void offer(float score, int64_t index) {
        int64_t at;
        if (size_ < k_) {
            at = size_++;
        } else if (score > items_[k_ - 1].score) {
            at = k_ - 1;
        } else {
            return;
        }
        while (at > 0 && items_[at - 1].score < score) {
            items_[at] = items_[at - 1];
            --at;
        }
        items_[at] = {score, index};
    }

   private:
    int64_t k_ = 0, size_ = 0;
    std::vector<Candidate> items_;
};

constexpr int64_t kTopKBlock = 32;

// The k best candidates of a sentence's beams: candidate (b, t) scores (rows[b][t] + offsets[b]) / divisor (float32,
// in that order; no division when Divided is false) at flat index b * width + t (topk.py's top_k_beams). Adding an
// offset and dividing by a positive number never reverse an order in float32, so a block whose maximum, scored, does
// not beat the worst kept candidate holds none better: only the other blocks are scored entry by entry.
template <bool Divided>
void top_k_beams(const float* const* rows, const float* offsets, int64_t beams, int64_t width, float divisor,
                 TopK& top) {
    for (int64_t b = 0; b < beams; ++b) {
        const float* row = rows[b];
        const float offset = offsets[b];
        for (int64_t start = 0; start < width; start += kTopKBlock) {
            const int64_t n = std::min(kTopKBlock, width - start);
            if (top.full()) {
                const float sum = block_max(row + start, n) + offset;
                const float score = Divided ? sum / divisor : sum;
                if (!(score > top.worst())) continue;
            }
            for (int64_t i = start; i < start + n; ++i) {
                const float sum = row[i] + offset;
                top.offer(Divided ? sum / divisor : sum, b * width + i);
            }
        }
    }
}

// --------------------------------------------------------------------------------------------- small orders
// order[0..n) = the indices of values, largest first, equal values in index order, NaN last: numpy's
// argsort(-values, kind="stable") (topk.py's top_k_sorted on a narrow row). Insertion sort: n is at most 3 beams.
inline void order_descending(const float* values, int64_t n, int64_t* order) {
    auto before = [values](int64_t a, int64_t b) {
        return values[a] > values[b] || (!std::isnan(values[a]) && std::isnan(values[b]));
    };
    for (int64_t i = 0; i < n; ++i) {
        int64_t at = i;
        while (at > 0 && before(i, order[at - 1])) {
            order[at] = order[at - 1];
            --at;
        }
        order[at] = i;
    }
}

}  // namespace mtgate
