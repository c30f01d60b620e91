# The e2e tests' server inside a sandbox (tests/e2e/ports_test.cc; perl for Digest::SHA).
# An HTTP echo server on 127.0.0.1:3000: answers the request head, a blank line, then the body.
# A WebSocket upgrade gets a 101, then every byte back (a raw echo).
use strict; use IO::Socket::INET; use Digest::SHA qw(sha1_base64);
$SIG{CHLD} = 'IGNORE';
my $l = IO::Socket::INET->new(LocalAddr => '127.0.0.1:3000', Listen => 64, ReuseAddr => 1) or die "listen: $!";
while (my $c = $l->accept) {
  next if fork;
  binmode $c;
  my $head = '';
  while (my $line = <$c>) { $head .= $line; last if $line eq "\r\n"; }
  if ($head =~ /^Upgrade:\s*websocket/mi) {
    my ($key) = $head =~ /^Sec-WebSocket-Key:\s*(\S+)/mi;
    my $acc = sha1_base64($key . '258EAFA5-E914-47DA-95CA-C5AB0DC85B11') . '=';
    print $c "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: $acc\r\n\r\n";
    $c->flush;
    my $buf; while (sysread($c, $buf, 65536)) { syswrite($c, $buf); }
    exit 0;
  }
  my ($len) = $head =~ /^Content-Length:\s*(\d+)/mi; $len //= 0;
  my $body = ''; while (length($body) < $len) { my $n = read($c, $body, $len - length($body), length($body)); last unless $n; }
  print $c "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Echo: yes\r\nContent-Length: " . (length($head) + length($body)) . "\r\nConnection: close\r\n\r\n" . $head . $body;
  close $c; exit 0;
}
