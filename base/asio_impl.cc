// Boost.Asio's and Boost.Beast's implementations, compiled once for every nsbox binary
// (BOOST_ASIO_SEPARATE_COMPILATION and BOOST_BEAST_SEPARATE_COMPILATION, set for every user in
// cmake/Dependencies.cmake): each file that uses them no longer compiles them again (13 of the
// 71 s serve.cc takes with g++).

#include <boost/asio/impl/src.hpp>
#include <boost/beast/src.hpp>
