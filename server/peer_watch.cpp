#include "server/peer_watch.h"

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <cerrno>
#include <sys/socket.h>

namespace moestream::server {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;

peer_state probe_peer(tcp::socket& s) {
    char byte = 0;
    for (;;) {
        const ssize_t n = ::recv(s.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
        if (n > 0) return peer_state::sent_more;
        if (n == 0) return peer_state::closed;
        if (errno == EINTR) continue;
        if (errno == EAGAIN || errno == EWOULDBLOCK) return peer_state::open;
        return peer_state::closed;  // reset, or the socket is no longer usable
    }
}

asio::awaitable<void> watch_peer(tcp::socket& s) {
    constexpr auto use_nothrow = asio::as_tuple(asio::use_awaitable);
    for (;;) {
        auto [ec] = co_await s.async_wait(tcp::socket::wait_read, use_nothrow);
        if (ec) co_return;  // cancelled, or the socket failed
        switch (probe_peer(s)) {
            case peer_state::closed: co_return;
            case peer_state::open: continue;  // a stale readiness report (see the header)
            case peer_state::sent_more: {
                asio::steady_timer forever(co_await asio::this_coro::executor, asio::steady_timer::time_point::max());
                co_await forever.async_wait(use_nothrow);
                co_return;
            }
        }
    }
}

}  // namespace moestream::server
