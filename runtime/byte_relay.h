#pragma once

// The daemon's one relay of bytes between two sockets: an exposed port's connections
// (runtime/ports.cc) and an upgraded connection through the HTTP path to a port
// (runtime/api/port_routes.cc).

#include <boost/asio.hpp>
#include <boost/asio/as_tuple.hpp>
#include <cstddef>
#include <functional>
#include <memory>
#include <vector>

namespace nsbox::runtime {

// Per direction and connection: a slow reader holds back its own connection only.
inline constexpr size_t kRelayBuffer = 64u << 10;

// Closes with an RST (SO_LINGER 0): the client sees at once that nothing is there.
template <typename Socket>
void Reset(Socket& s) {
  boost::system::error_code ec;
  if (!s.is_open()) return;
  s.set_option(boost::asio::socket_base::linger(true, 0), ec);
  s.close(ec);
}

// One direction: reads from `from`, writes to `to`; the end of `from` is passed on as a
// shutdown of `to`'s sending side. Any error resets both (`abort`), so that each side sees the
// connection fail rather than end as if everything had been sent. `keep` is held until the end.
template <typename From, typename To>
boost::asio::awaitable<void> Pipe(std::shared_ptr<void> /*keep*/, From& from, To& to,
                                  std::function<void()> abort) {
  namespace asio = boost::asio;
  constexpr auto kTuple = asio::as_tuple(asio::use_awaitable);
  std::vector<char> buf(kRelayBuffer);
  for (;;) {
    auto [ec, n] = co_await from.async_read_some(asio::buffer(buf), kTuple);
    if (ec == asio::error::eof) {
      boost::system::error_code ignored;
      to.shutdown(asio::socket_base::shutdown_send, ignored);
      co_return;
    }
    if (ec) {
      abort();
      co_return;
    }
    auto [wec, written] = co_await asio::async_write(to, asio::buffer(buf.data(), n), kTuple);
    (void)written;
    if (wec) {
      abort();
      co_return;
    }
  }
}

}  // namespace nsbox::runtime
