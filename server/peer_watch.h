#pragma once
// Noticing that an HTTP client went away while its request is still being answered, so that
// its generation is cancelled at once even while nothing is being written to it.
#include <boost/asio/awaitable.hpp>
#include <boost/asio/ip/tcp.hpp>

namespace moestream::server {

// What the read side of a connection says about its peer, read without consuming a byte.
enum class peer_state {
    open,       // nothing to read yet: the peer is there and waiting for its answer
    closed,     // end of stream or a socket error: nobody will read the answer
    sent_more,  // bytes are waiting (a pipelined request): the peer is there
};

// A non-blocking peek at one byte.
peer_state probe_peer(boost::asio::ip::tcp::socket& s);

// Resolves when the peer has closed the connection or the socket failed; with bytes waiting
// it waits until cancelled (the route that raced it finished first). A readiness report that
// turns out to have nothing behind it is waited past, never taken for a close: with several
// I/O threads Asio may hand this wait a read event the request's own reads already drained
// (the thread that polled it ran late), and taking that for a hang-up cancelled live requests
// under load.
boost::asio::awaitable<void> watch_peer(boost::asio::ip::tcp::socket& s);

}  // namespace moestream::server
