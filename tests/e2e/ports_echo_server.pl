# The e2e tests' server inside a sandbox (tests/e2e/ports_test.cc; perl for Digest::SHA).
# An HTTP echo server on 127.0.0.1:3000: answers the request head, a blank line, then the body.
# A WebSocket upgrade gets a 101 (which tries to plant the daemon's token cookie), then every
# frame back (a WebSocket echo).
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
    print $c "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Accept: $acc\r\nSet-Cookie: nsbox_token=planted; Path=/\r\nSet-Cookie: theme=dark\r\n\r\n";
    $c->flush;
    # Every frame back, unmasked (RFC 6455 5.2); a close frame ends it.
    my $rd = sub { my ($n) = @_; my $b = ''; while (length($b) < $n) { my $r = sysread($c, $b, $n - length($b), length($b)); exit 0 unless $r; } $b };
    while (1) {
      my ($b0, $b1) = unpack('CC', $rd->(2));
      my $len = $b1 & 127;
      $len = unpack('n', $rd->(2)) if $len == 126;
      $len = unpack('Q>', $rd->(8)) if $len == 127;
      my $mask = ($b1 & 128) ? $rd->(4) : "\0\0\0\0";
      my $p = $len ? $rd->($len) : '';
      $p ^= substr($mask x (int($len / 4) + 1), 0, $len);
      my $hdr = pack('C', $b0);
      $hdr .= $len < 126 ? pack('C', $len) : $len < 65536 ? pack('Cn', 126, $len) : pack('CQ>', 127, $len);
      syswrite($c, $hdr . $p);
      exit 0 if ($b0 & 15) == 8;
    }
  }
  my ($len) = $head =~ /^Content-Length:\s*(\d+)/mi; $len //= 0;
  my $body = ''; while (length($body) < $len) { my $n = read($c, $body, $len - length($body), length($body)); last unless $n; }
  print $c "HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nX-Echo: yes\r\nContent-Length: " . (length($head) + length($body)) . "\r\nConnection: close\r\n\r\n" . $head . $body;
  close $c; exit 0;
}
