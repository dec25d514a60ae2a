// serving._native_core: the search core (greedy, beam, sampling, the logits rules, top-k) and the stationary
// cache's slot bookkeeping, for serving/decoding/native.py and serving/rows/slots.py. Each call checks its arrays
// with the GIL held, releases it for the whole of its work, and builds its results (numpy arrays, lists) once it has
// it back: a server's event loop and the runtime's threads run beside it. An object is used by one thread at a time
// (a search is driven by one worker).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include "beam.hpp"
#include "greedy.hpp"
#include "kernels.hpp"
#include "rules.hpp"
#include "slots.hpp"
#include "step.hpp"

namespace nb = nanobind;
using namespace nb::literals;
using namespace mtgate;

namespace {

using LogProbs = nb::ndarray<float, nb::ndim<2>, nb::c_contig, nb::device::cpu>;
using Ids = nb::ndarray<const int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Seeds = nb::ndarray<const uint64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
template <typename T>
using Table = nb::ndarray<const T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Counters = nb::ndarray<int64_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;
using Cache6 = nb::ndarray<float, nb::ndim<6>, nb::c_contig, nb::device::cpu>;
using Bias4 = nb::ndarray<float, nb::ndim<4>, nb::c_contig, nb::device::cpu>;

// A numpy array that owns ``values`` (moved into it).
template <typename T>
nb::object to_numpy(std::vector<T>&& values, std::initializer_list<size_t> shape) {
    auto* owned = new std::vector<T>(std::move(values));
    if (owned->empty()) owned->reserve(1);  // a valid pointer even for an empty array
    nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
    return nb::cast(nb::ndarray<nb::numpy, T>(owned->data(), shape, owner));
}

nb::list to_list(const std::vector<int64_t>& values) {
    nb::list out;
    for (int64_t v : values) out.append(v);
    return out;
}

Columns columns_of(const LogProbs& log_probs, const std::optional<Ids>& columns) {
    Columns c;
    c.size = static_cast<int64_t>(log_probs.shape(1));
    if (columns) {
        if (static_cast<int64_t>(columns->shape(0)) != c.size) {
            throw std::invalid_argument("columns must name one id per log-prob column");
        }
        c.ids = columns->data();
    }
    return c;
}

// (plan, finished, stream): plan (tokens [m, 1], rows [m], encoder_rows [m] or None) or None when every sentence is
// done; finished [(id, tokens, score, [(tokens, score), ...])]; stream (ids, tokens [d, w], lengths) or None.
nb::tuple to_python(Step&& step) {
    nb::object plan = nb::none();
    if (step.has_plan) {
        const size_t m = step.tokens.size();
        nb::object encoder_rows = step.has_encoder_rows ? to_numpy(std::move(step.encoder_rows), {m}) : nb::none();
        plan = nb::make_tuple(to_numpy(std::move(step.tokens), {m, 1}), to_numpy(std::move(step.rows), {m}),
                              encoder_rows);
    }
    nb::list finished;
    for (const Finished& f : step.finished) {
        nb::list alternatives;
        for (const auto& [tokens, score] : f.alternatives) alternatives.append(nb::make_tuple(to_list(tokens), score));
        finished.append(nb::make_tuple(f.id, to_list(f.tokens), f.score, alternatives));
    }
    nb::object stream = nb::none();
    if (step.has_stream) {
        const size_t d = step.stream_ids.size(), w = static_cast<size_t>(step.stream_width);
        stream = nb::make_tuple(to_numpy(std::move(step.stream_ids), {d}), to_numpy(std::move(step.stream_tokens), {d, w}),
                                to_numpy(std::move(step.stream_lengths), {d}));
    }
    return nb::make_tuple(plan, finished, stream);
}

void check_rows(const LogProbs& log_probs, int64_t rows) {
    if (static_cast<int64_t>(log_probs.shape(0)) != rows) {
        throw std::invalid_argument("log_probs has " + std::to_string(log_probs.shape(0)) + " rows, the search " +
                                    std::to_string(rows));
    }
    if (log_probs.shape(1) == 0) throw std::invalid_argument("log_probs has no columns");
}

// The per-sentence inputs every search takes: caps, ids and target prefixes.
struct Sentences {
    std::vector<int64_t> caps, ids;
    std::vector<std::vector<int64_t>> prefixes;
};

Sentences sentences_of(const Ids& caps, const Ids& ids, const std::optional<std::vector<std::vector<int64_t>>>& prefixes) {
    const size_t n = caps.shape(0);
    if (ids.shape(0) != n || (prefixes && prefixes->size() != n)) {
        throw std::invalid_argument("caps, ids and prefixes must have one entry per sentence");
    }
    Sentences out{{caps.data(), caps.data() + n}, {ids.data(), ids.data() + n}, {}};
    out.prefixes = prefixes ? *prefixes : std::vector<std::vector<int64_t>>(n);
    for (size_t i = 0; i < n; ++i) {
        if (out.caps[i] < 1) throw std::invalid_argument("max_steps must be at least 1");
    }
    return out;
}

void make_greedy(Greedy* self, const Options& options, const Ids& caps, const Ids& ids,
                   const std::optional<std::vector<std::vector<int64_t>>>& prefixes, const std::optional<Seeds>& seeds,
                   const Table<double>& norm) {
    Sentences in = sentences_of(caps, ids, prefixes);
    const size_t n = in.caps.size();
    if (seeds && seeds->shape(0) != n) throw std::invalid_argument("seeds must have one entry per sentence");
    std::vector<Greedy::Sentence> sentences(n);
    for (size_t i = 0; i < n; ++i) {
        Greedy::Sentence& s = sentences[i];
        s.id = in.ids[i];
        s.cap = in.caps[i];
        s.prefix = std::move(in.prefixes[i]);
        s.out.assign(static_cast<size_t>(s.cap), options.eos_id);
        s.seed = seeds ? seeds->data()[i] : 0;
    }
    new (self) Greedy(options, std::move(sentences), std::vector<double>(norm.data(), norm.data() + norm.shape(0)));
}

void make_beam(Beam* self, const Options& options, const Ids& caps, const Ids& ids,
               const std::optional<std::vector<std::vector<int64_t>>>& prefixes, const Table<float>& penalty,
               const Table<float>& normalizer) {
    if (options.beam_size < 1) throw std::invalid_argument("beam_size must be at least 1");
    Sentences in = sentences_of(caps, ids, prefixes);
    std::vector<Beam::Sentence> sentences(in.caps.size());
    for (size_t i = 0; i < sentences.size(); ++i) {
        sentences[i].id = in.ids[i];
        sentences[i].cap = in.caps[i];
        sentences[i].prefix = std::move(in.prefixes[i]);
    }
    new (self) Beam(options, std::move(sentences), {penalty.data(), penalty.data() + penalty.shape(0)},
                {normalizer.data(), normalizer.data() + normalizer.shape(0)});
}

template <typename Search>
nb::tuple advance(Search& search, LogProbs log_probs, std::optional<Ids> columns, bool renormalized) {
    check_rows(log_probs, search.rows());
    const Columns c = columns_of(log_probs, columns);
    Step step;
    {
        nb::gil_scoped_release release;
        step = search.advance(log_probs.data(), c, renormalized);
    }
    return to_python(std::move(step));
}

template <typename Search>
void before_renormalize(Search& search, LogProbs log_probs, std::optional<Ids> columns) {
    check_rows(log_probs, search.rows());
    const Columns c = columns_of(log_probs, columns);
    nb::gil_scoped_release release;
    search.before_renormalize(log_probs.data(), c);
}

template <typename Search>
nb::object remove(Search& search, Ids ids) {
    std::vector<int64_t> kept;
    {
        nb::gil_scoped_release release;
        kept = search.remove(ids.data(), static_cast<int64_t>(ids.shape(0)));
    }
    if (kept.empty()) return nb::none();
    const size_t m = kept.size();
    return to_numpy(std::move(kept), {m});
}

nb::tuple assign(Ids origin, Counters owner, Counters positions, Counters source_len, Cache6 cache, Cache6 cross,
                 Bias4 src_bias) {
    const size_t slots = cache.shape(2);
    if (owner.shape(0) != slots || positions.shape(0) != slots || source_len.shape(0) != slots ||
        cross.shape(2) != slots || src_bias.shape(0) != slots || cross.shape(0) != cache.shape(0) ||
        cross.shape(3) != cache.shape(3) || cross.shape(5) != cache.shape(5) || src_bias.shape(3) != cross.shape(4)) {
        throw std::invalid_argument("the slot arrays do not agree on their shapes");
    }
    const int64_t m = static_cast<int64_t>(origin.shape(0));
    if (static_cast<size_t>(m) > slots) throw std::invalid_argument("more rows than slots");
    for (int64_t i = 0; i < m; ++i) {
        if (origin.data()[i] >= static_cast<int64_t>(slots)) throw std::invalid_argument("a row names no slot");
    }
    SlotArrays a{owner.data(), positions.data(), source_len.data(), cache.data(), cross.data(), src_bias.data(),
                 static_cast<int64_t>(cache.shape(0) * cache.shape(1)), static_cast<int64_t>(slots),
                 static_cast<int64_t>(cache.shape(3)), static_cast<int64_t>(cache.shape(4)),
                 static_cast<int64_t>(cache.shape(5)), static_cast<int64_t>(cross.shape(4))};
    for (int64_t i = 0; i < m; ++i) {
        if (origin.data()[i] >= 0 && positions.data()[origin.data()[i]] > a.capacity) {
            throw std::invalid_argument("a slot's position is past the cache");
        }
    }
    std::vector<int64_t> slot, fresh;
    {
        nb::gil_scoped_release release;
        slot = assign_slots(a, origin.data(), m, fresh);
    }
    const size_t f = fresh.size();
    return nb::make_tuple(to_numpy(std::move(slot), {static_cast<size_t>(m)}), to_numpy(std::move(fresh), {f}));
}

}  // namespace

NB_MODULE(_native_core, m) {
    m.doc() = "mtgate's search core (serving/decoding/native.py) and slot bookkeeping (serving/rows/slots.py)";

    nb::class_<Options>(m, "Options")
        .def(nb::init<>())
        .def_rw("eos_id", &Options::eos_id)
        .def_rw("decoder_start_id", &Options::decoder_start_id)
        .def_rw("beam_size", &Options::beam_size)
        .def_rw("gnmt", &Options::gnmt)
        .def_rw("forced_eos", &Options::forced_eos)
        .def_rw("early_stopping", &Options::early_stopping)
        .def_rw("renormalize_logits", &Options::renormalize_logits)
        .def_rw("num_hypotheses", &Options::num_hypotheses)
        .def_rw("min_length", &Options::min_length)
        .def_rw("repetition_penalty", &Options::repetition_penalty)
        .def_rw("no_repeat_ngram_size", &Options::no_repeat_ngram_size)
        .def_rw("bad_word_ids", &Options::bad_word_ids)
        .def_rw("sampling", &Options::sampling)
        .def_rw("temperature", &Options::temperature)
        .def_rw("top_k", &Options::top_k)
        .def_rw("stream", &Options::stream);

    nb::class_<Greedy>(m, "Greedy")
        .def("__init__", &make_greedy, "options"_a, "caps"_a, "ids"_a, "prefixes"_a.none(), "seeds"_a.none(), "norm"_a)
        .def_prop_ro("rows", &Greedy::rows)
        .def("advance", &advance<Greedy>, "log_probs"_a, "columns"_a.none(), "renormalized"_a)
        .def("before_renormalize", &before_renormalize<Greedy>, "log_probs"_a, "columns"_a.none())
        .def("join", &Greedy::join, "other"_a, nb::call_guard<nb::gil_scoped_release>())
        .def("remove", &remove<Greedy>, "ids"_a);

    nb::class_<Beam>(m, "Beam")
        .def("__init__", &make_beam, "options"_a, "caps"_a, "ids"_a, "prefixes"_a.none(), "penalty"_a, "normalizer"_a)
        .def_prop_ro("rows", &Beam::rows)
        .def_prop_ro("expanded", &Beam::expanded)
        .def("advance", &advance<Beam>, "log_probs"_a, "columns"_a.none(), "renormalized"_a)
        .def("before_renormalize", &before_renormalize<Beam>, "log_probs"_a, "columns"_a.none())
        .def("join", &Beam::join, "other"_a, nb::call_guard<nb::gil_scoped_release>())
        .def("remove", &remove<Beam>, "ids"_a);

    m.def("assign_slots", &assign, "origin"_a, "owner"_a, "positions"_a, "source_len"_a, "cache"_a, "cross"_a,
          "src_bias"_a);
    m.def("kernel", &block_max_name, "the block-maximum kernel in use: avx2 or sse2");
    m.def("use_kernel", [](const std::string& name) { return use_kernel(name.c_str()); }, "name"_a,
          "select the block-maximum kernel (avx2 where the CPU has it, or sse2); whether it is in use");
}
