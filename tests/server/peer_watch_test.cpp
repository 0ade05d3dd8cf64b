// peer_watch on real loopback sockets: a peer with nothing to say is open (never taken for a
// hang-up: that cancelled live streams under load), a closed or reset peer is closed, pipelined
// bytes are not a close and are left unread; watch_peer resolves on a close only.
#include <boost/test/unit_test.hpp>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/write.hpp>
#include <chrono>

#include "server/peer_watch.h"

namespace moestream::server {
namespace {

namespace asio = boost::asio;
using tcp = asio::ip::tcp;
using namespace std::chrono_literals;

struct socket_pair {
    asio::io_context ioc;
    tcp::socket client{ioc}, server{ioc};
    socket_pair() {
        tcp::acceptor a(ioc, tcp::endpoint(asio::ip::make_address("127.0.0.1"), 0));
        client.connect(a.local_endpoint());
        a.accept(server);
    }
    // Blocks until the server side is readable (the client's bytes or its FIN have arrived).
    void until_readable() { server.wait(tcp::socket::wait_read); }
    // Starts watch_peer on the server side (run by ioc); `resolved` turns true when it returns.
    void watch(bool& resolved) {
        asio::co_spawn(ioc, [this, &resolved]() -> asio::awaitable<void> {
            co_await watch_peer(server);
            resolved = true;
        }, asio::detached);
    }
};

BOOST_AUTO_TEST_SUITE(peer_watch)

BOOST_AUTO_TEST_CASE(a_quiet_peer_is_open) {
    socket_pair p;
    BOOST_TEST(int(probe_peer(p.server)) == int(peer_state::open));
    BOOST_TEST(int(probe_peer(p.server)) == int(peer_state::open));  // asking again changes nothing
}

BOOST_AUTO_TEST_CASE(a_closed_peer_is_closed) {
    socket_pair p;
    p.client.shutdown(tcp::socket::shutdown_send);
    p.until_readable();
    BOOST_TEST(int(probe_peer(p.server)) == int(peer_state::closed));
}

BOOST_AUTO_TEST_CASE(a_reset_peer_is_closed) {
    socket_pair p;
    p.client.set_option(asio::socket_base::linger(true, 0));  // close sends RST
    p.client.close();
    p.until_readable();
    BOOST_TEST(int(probe_peer(p.server)) == int(peer_state::closed));
}

BOOST_AUTO_TEST_CASE(pipelined_bytes_are_not_a_close_and_stay_unread) {
    socket_pair p;
    asio::write(p.client, asio::buffer(std::string_view("GET / HTTP/1.1\r\n")));
    p.until_readable();
    BOOST_TEST(int(probe_peer(p.server)) == int(peer_state::sent_more));
    BOOST_TEST(p.server.available() == 16u);  // the peek consumed nothing
    p.client.shutdown(tcp::socket::shutdown_send);  // bytes first, then the FIN: still bytes
    BOOST_TEST(int(probe_peer(p.server)) == int(peer_state::sent_more));
}

BOOST_AUTO_TEST_CASE(watch_resolves_on_a_close_only) {
    socket_pair p;
    bool resolved = false;
    p.watch(resolved);
    p.ioc.run_for(100ms);
    BOOST_TEST(!resolved, "resolved with the peer still there");
    p.client.shutdown(tcp::socket::shutdown_send);
    p.ioc.restart();
    p.ioc.run_for(5s);
    BOOST_TEST(resolved, "a closed peer was not noticed");
}

BOOST_AUTO_TEST_CASE(watch_waits_past_pipelined_bytes) {
    socket_pair p;
    bool resolved = false;
    p.watch(resolved);
    asio::write(p.client, asio::buffer(std::string_view("x")));
    p.ioc.run_for(200ms);
    BOOST_TEST(!resolved, "pipelined bytes were taken for a close");
    BOOST_TEST(p.server.available() == 1u);
}

BOOST_AUTO_TEST_SUITE_END()

}  // namespace
}  // namespace moestream::server
