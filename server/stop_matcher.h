// Stop strings ("stop" in a request) found in generated text that arrives one token at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace moestream::server {

// Finds the first occurrence of any stop string in a text that arrives in pieces. Text that could
// still be the beginning of a stop string is withheld until disambiguated, so a stop string is
// never emitted, even when split across tokens; everything before the match is emitted.
//
// Which match wins: generation stops as soon as some stop string is complete, so the match is the
// one that ENDS first in the text; among stop strings ending at that same byte (one is then a
// suffix of the other) the longest wins, i.e. the earliest start. With "ab" and "abc", "xabc"
// stops at "ab" (it is complete first); with "bc" and "abc" it stops at "abc". The result does not
// depend on how the text is cut into pieces.
//
// Cost: an Aho-Corasick automaton over the stop strings, so each byte is examined a bounded
// amortised number of times, and at most (longest stop - 1) bytes (plus up to 3 to keep a UTF-8
// character whole) are withheld and copied per push. Stop strings are expected to be valid UTF-8
// (the request's JSON parser guarantees it); emitted text then stays valid UTF-8.
class stop_matcher {
  public:
    explicit stop_matcher(std::vector<std::string> stops);  // empty strings ignored

    // Appends text; returns the text that is now safe to emit. After a match, returns the text up
    // to the match and stopped() becomes true; later pushes return "".
    std::string push(std::string_view text);
    std::string finish();  // end of generation: releases withheld text (no match)
    bool stopped() const { return stopped_; }
    const std::string& matched() const { return matched_; }  // the stop string found
    size_t withheld_bytes() const { return withheld_.size(); }

  private:
    static constexpr uint32_t k_root = 0;
    struct node {
        std::vector<std::pair<unsigned char, uint32_t>> children;
        uint32_t fail = k_root;  // longest proper suffix of this node's text that is a node
        uint32_t depth = 0;      // length of this node's text
        int32_t match = -1;      // index in stops_ of the longest stop string ending here, or -1
    };

    uint32_t child(uint32_t n, unsigned char c) const;  // k_root when absent (root never a child)
    uint32_t advance(uint32_t n, unsigned char c) const;

    std::vector<std::string> stops_;
    std::vector<node> nodes_;
    uint32_t state_ = k_root;  // the longest suffix of the text so far that begins a stop string
    std::string withheld_;
    std::string matched_;
    bool stopped_ = false;
    bool finished_ = false;
};

}  // namespace moestream::server
