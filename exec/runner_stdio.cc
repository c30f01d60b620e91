// A command's stdio: its pipes or its terminal, its output read (PauseOutput's backpressure, the
// output cap), its input written (Input, Resize), and the read buffers kept for the next commands.

#include <errno.h>
#include <fcntl.h>
#include <sys/ioctl.h>
#include <termios.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <string>

#include "base/files.h"
#include "base/log.h"
#include "exec/runner_internal.h"

namespace nsbox::exec {

namespace {

Status MakePipe(UniqueFd* read_end, UniqueFd* write_end) {
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) < 0) return Error::Sys("pipe2", "", errno);
  read_end->reset(fds[0]);
  write_end->reset(fds[1]);
  return Ok();
}

// The terminal's end-of-file character (c_cc[VEOF] of the slave's termios, which tcgetattr on
// the master reads); ^D when it cannot be read or is disabled.
char EofCharacter(int master) {
  struct termios t {};
  if (::tcgetattr(master, &t) == 0 && t.c_cc[VEOF] != _POSIX_VDISABLE) {
    return static_cast<char>(t.c_cc[VEOF]);
  }
  return '\x04';
}

Status SetNonBlocking(int fd) {
  int flags = ::fcntl(fd, F_GETFL);
  if (flags < 0 || ::fcntl(fd, F_SETFL, flags | O_NONBLOCK) < 0) {
    return Error::Sys("fcntl", "O_NONBLOCK", errno);
  }
  return Ok();
}

}  // namespace

namespace runner_internal {

// 1 MiB, or less where fs.pipe-max-size is lower (asking for more would fail with EPERM).
int PipeSizeToAsk() {
  auto text = ReadFile("/proc/sys/fs/pipe-max-size");
  if (!text.ok()) return kWantedPipeSize;
  long max = std::strtol(text->c_str(), nullptr, 10);
  if (max <= 0) return kWantedPipeSize;
  return static_cast<int>(std::min<long>(max, kWantedPipeSize));
}

// A pty pair of the given size: the master non-blocking and close-on-exec, the slave (opened
// from the master: TIOCGPTPEER, so no path lookup in /dev/pts can hand back another terminal)
// close-on-exec and blocking, as a command expects its terminal.
Status OpenTerminal(TerminalSize size, UniqueFd* master, UniqueFd* slave) {
  int m = ::open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC | O_NONBLOCK);
  if (m < 0) return Error::Sys("open", "/dev/ptmx", errno);
  master->reset(m);
  int unlock = 0;
  if (::ioctl(m, TIOCSPTLCK, &unlock) < 0) {
    return Error::Sys("ioctl(TIOCSPTLCK)", "/dev/ptmx", errno);
  }
  struct winsize ws {};
  ws.ws_row = size.rows;
  ws.ws_col = size.cols;
  if (::ioctl(m, TIOCSWINSZ, &ws) < 0) return Error::Sys("ioctl(TIOCSWINSZ)", "/dev/ptmx", errno);
  int s = ::ioctl(m, TIOCGPTPEER, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (s < 0) return Error::Sys("ioctl(TIOCGPTPEER)", "/dev/ptmx", errno);
  slave->reset(s);
  return Ok();
}

Result<UniqueFd> DupCloexec(int fd, const char* what) {
  int d = ::fcntl(fd, F_DUPFD_CLOEXEC, 3);
  if (d < 0) return Error::Sys("fcntl(F_DUPFD_CLOEXEC)", what, errno);
  return UniqueFd(d);
}

Status MakeStdioPipes(bool with_stdin, int enlarge_to, StdioPipes* p) {
  NSBOX_TRY_CTX(MakePipe(&p->out, &p->child_out), "stdout pipe");
  NSBOX_TRY_CTX(MakePipe(&p->err, &p->child_err), "stderr pipe");
  NSBOX_TRY_CTX(SetNonBlocking(p->out.get()), "stdout pipe");
  NSBOX_TRY_CTX(SetNonBlocking(p->err.get()), "stderr pipe");
  if (enlarge_to > 0) {
    for (int fd : {p->out.get(), p->err.get()}) (void)::fcntl(fd, F_SETPIPE_SZ, enlarge_to);
  }
  if (with_stdin) {
    NSBOX_TRY_CTX(MakePipe(&p->child_in, &p->in), "stdin pipe");
    NSBOX_TRY_CTX(SetNonBlocking(p->in.get()), "stdin pipe");
  }
  return Ok();
}

}  // namespace runner_internal

void Runner::Impl::ArmRead(const CommandPtr& cmd, int stream) {
  Stream& s = stream == 1 ? cmd->out : cmd->err;
  s.op = reactor.Read(s.fd.get(), s.buf.get(), kReadBufferSize, [cmd, stream](ssize_t n) {
    Stream& st = stream == 1 ? cmd->out : cmd->err;
    st.op = 0;
    if (cmd->impl == nullptr) return;
    cmd->impl->OnRead(cmd, stream, n);
  });
}

void Runner::Impl::OnRead(const CommandPtr& cmd, int stream, ssize_t n) {
  Stream& s = stream == 1 ? cmd->out : cmd->err;
  if (n == -EINTR || n == -EAGAIN) {
    // Not ready after all, or no submission slot now: wait for data, then read again.
    s.op = reactor.PollIn(s.fd.get(), [cmd, stream](int res) {
      Stream& st = stream == 1 ? cmd->out : cmd->err;
      st.op = 0;
      if (cmd->impl == nullptr) return;
      if (res == -ECANCELED) {
        cmd->impl->OnRead(cmd, stream, res);
        return;
      }
      cmd->impl->ArmRead(cmd, stream);
    });
    return;
  }
  if (n <= 0) {
    // EOF, an error, or cancelled: this stream is done.
    s.eof = true;
    s.fd.reset();
    KeepBuffer(std::move(s.buf));
    if (cmd->reported) {
      MaybeRetire(cmd);
    } else {
      MaybeFinish(cmd);
    }
    return;
  }
  s.read += static_cast<uint64_t>(n);
  if (s.read_at_exit) {
    s.drain_to += static_cast<uint64_t>(n);  // see OnMainExit
    s.read_at_exit = false;
  }
  if (!cmd->reported && !cmd->truncated) Deliver(cmd, stream, static_cast<size_t>(n));
  // After the answer, reading goes on and the bytes are dropped: a background process must
  // never block on a full pipe.
  if (s.fd.valid() && cmd->impl != nullptr) ReadNext(cmd, stream);
}

void Runner::Impl::ReadNext(const CommandPtr& cmd, int stream) {
  Stream& s = stream == 1 ? cmd->out : cmd->err;
  if (output_paused && !cmd->reported) {
    s.parked = true;
    parked_reads.emplace_back(cmd, stream);
    return;
  }
  ArmRead(cmd, stream);
}

void Runner::Impl::Unpark(const CommandPtr& cmd, int stream) {
  Stream& s = stream == 1 ? cmd->out : cmd->err;
  if (!s.parked) return;
  s.parked = false;
  if (cmd->impl != nullptr && s.fd.valid() && s.op == 0) ArmRead(cmd, stream);
}

void Runner::Impl::PauseOutput(bool paused) {
  output_paused = paused;
  if (paused) return;
  output_resumed = Clock::now();
  std::vector<std::pair<CommandPtr, int>> parked;
  parked.swap(parked_reads);
  for (const auto& [cmd, stream] : parked) Unpark(cmd, stream);
}

void Runner::Impl::Deliver(const CommandPtr& cmd, int stream, size_t n) {
  Stream& s = stream == 1 ? cmd->out : cmd->err;
  uint64_t room = cmd->limit - std::min(cmd->limit, cmd->delivered);
  size_t give = static_cast<size_t>(std::min<uint64_t>(n, room));
  if (give > 0) {
    cmd->delivered += give;
    if (stream == 2) cmd->stderr_at_line_start = s.buf[give - 1] == '\n';
    if (cmd->events.on_output) cmd->events.on_output(stream, std::string_view(s.buf.get(), give));
  }
  if (n > room) {
    cmd->truncated = true;
    // Once the main process has exited, what is left (the rest of its output, what its
    // background processes print) is read and dropped, never a reason to kill what it left
    // running (api.md): a `server &` that logged much in the drain window was killed with it.
    // The answer still says output_limit, since output was lost.
    if (cmd->main_exited) {
      cmd->capped_after_exit = true;
    } else {
      BeginKill(cmd, EndReason::kOutputLimit);
    }
  }
}

void Runner::Impl::PumpInput(const CommandPtr& cmd) {
  while (cmd->write_op == 0 && !cmd->input.empty()) {
    if (cmd->reported) {
      FailInput(cmd, EPIPE, "the command has ended");
      return;
    }
    Command::InputChunk& front = cmd->input.front();
    if (front.done < front.data.size()) {
      if (!cmd->in.valid()) {
        FailInput(cmd, EPIPE, "the command's stdin is closed");
        return;
      }
      ArmWrite(cmd);
      return;
    }
    Command::InputChunk chunk = std::move(front);
    cmd->input.pop_front();
    if (chunk.answer) cmd->input_pending -= chunk.data.size();
    if (chunk.close) {
      // A pipe: the command reads EOF. A terminal: the VEOF character was the chunk's last
      // byte, and this closes only the dup written to (the master stays, for the output).
      cmd->in.reset();
      cmd->input_closed = true;
    }
    if (chunk.answer) chunk.answer(0, "");
  }
}

void Runner::Impl::ArmWrite(const CommandPtr& cmd) {
  // The front chunk stays in place (a deque never moves its elements on push_back) until the
  // write's callback has run: the kernel may read the buffer until then.
  const Command::InputChunk& front = cmd->input.front();
  cmd->write_op = reactor.Write(cmd->in.get(), front.data.data() + front.done,
                                front.data.size() - front.done, [cmd](ssize_t n) {
                                  cmd->write_op = 0;
                                  if (cmd->impl == nullptr) return;
                                  cmd->impl->OnWrite(cmd, n);
                                });
}

void Runner::Impl::OnWrite(const CommandPtr& cmd, ssize_t n) {
  if (n > 0 && !cmd->input.empty()) {
    cmd->input.front().done += static_cast<size_t>(n);
    PumpInput(cmd);
    return;
  }
  if ((n == -EAGAIN || n == -EINTR) && !cmd->reported) {
    // The pipe was full after all, or the reactor had no submission slot: wait for room.
    cmd->write_op = reactor.PollOut(cmd->in.get(), [cmd](int res) {
      cmd->write_op = 0;
      if (cmd->impl == nullptr) return;
      if (res == -ECANCELED || cmd->reported) {
        cmd->impl->OnWrite(cmd, -ECANCELED);
        return;
      }
      cmd->impl->PumpInput(cmd);
    });
    return;
  }
  // EPIPE (the command closed its stdin, or never reads it: not an error of the command),
  // another error, or cancelled at the end: stdin is closed and what is queued is refused.
  std::string why;
  if (n == -ECANCELED || cmd->reported) {
    why = "the command has ended";
  } else if (n == -EPIPE) {
    why = "the command closed its stdin";
  } else if (n == -EIO && cmd->tty.valid()) {
    why = "the terminal is closed: no process of the command holds it";
  } else {
    why = "write to the command's stdin: " + ErrnoText(n < 0 ? static_cast<int>(-n) : EIO);
  }
  FailInput(cmd, EPIPE, why);
}

void Runner::Impl::FailInput(const CommandPtr& cmd, int err, const std::string& why) {
  // Never with a write in flight: its buffer is a chunk of the queue.
  cmd->in.reset();
  cmd->input_closed = true;
  if (cmd->input_closed_why.empty()) cmd->input_closed_why = why;
  std::deque<Command::InputChunk> chunks;
  chunks.swap(cmd->input);
  cmd->input_pending = 0;
  for (auto& chunk : chunks) {
    if (chunk.answer) chunk.answer(err, why);
  }
}

void Runner::Impl::Input(uint64_t id, std::string data, bool close, InputDone done) {
  auto it = commands.find(id);
  if (it == commands.end()) {
    done(ESRCH, "no command " + std::to_string(id));
    return;
  }
  CommandPtr cmd = it->second;  // held: an answer may retire it
  if (cmd->reported) {
    done(EPIPE, "the command has ended");
    return;
  }
  if (!cmd->stdin_stream) {
    done(EINVAL, "the command's stdin is not a stream (it was started without stdin_stream)");
    return;
  }
  if (cmd->input_closed) {
    done(EPIPE,
         cmd->input_closed_why.empty() ? "the command's stdin is closed" : cmd->input_closed_why);
    return;
  }
  if (cmd->input.size() >= kMaxPendingInputs ||
      cmd->input_pending + data.size() + (close ? 2 : 0) > kMaxPendingInput) {
    done(EAGAIN, "too much input waiting to be written (" + std::to_string(cmd->input.size()) +
                     " inputs, " + std::to_string(cmd->input_pending) + " bytes; at most " +
                     std::to_string(kMaxPendingInputs) + " and " +
                     std::to_string(kMaxPendingInput) +
                     "): send the next input after the answer to the previous one");
    return;
  }
  if (cmd->tty.valid()) {
    // A terminal in canonical mode reads VEOF as the end of the input only at the start of a
    // line; after "partial" it only hands the partial line over. So a close after an unended
    // line sends it twice: the line, then the end (a close=1 with "partial" never ended the
    // command's read before).
    const char eof = EofCharacter(cmd->tty.get());
    if (!data.empty()) {
      const char last = data.back();
      cmd->tty_line_open = last != '\n' && last != '\r' && last != eof;
    }
    if (close) {
      if (cmd->tty_line_open) data.push_back(eof);
      data.push_back(eof);
    }
  }
  cmd->input_pending += data.size();
  cmd->input.push_back({std::move(data), 0, close, std::move(done)});
  if (close) {
    cmd->input_closed = true;
    cmd->input_closed_why = "stdin was closed by an earlier input";
  }
  PumpInput(cmd);
}

Status Runner::Impl::Resize(uint64_t id, TerminalSize size) {
  auto it = commands.find(id);
  if (it == commands.end() || it->second->reported) {
    return Error(ESRCH, "no running command " + std::to_string(id));
  }
  Command& cmd = *it->second;
  if (!cmd.tty.valid()) return Error(ENOTTY, "the command has no terminal");
  struct winsize ws {};
  ws.ws_row = size.rows;
  ws.ws_col = size.cols;
  if (::ioctl(cmd.tty.get(), TIOCSWINSZ, &ws) < 0) {
    return Error::Sys("ioctl(TIOCSWINSZ)", "the terminal's master", errno);
  }
  return Ok();
}

std::unique_ptr<char[]> Runner::Impl::TakeBuffer() {
  if (buffers.empty()) return std::unique_ptr<char[]>(new char[kReadBufferSize]);
  auto buf = std::move(buffers.back());
  buffers.pop_back();
  return buf;
}

// A stream's buffer once no read is pending on it: kept for the next command (its pages are
// already mapped), up to kKeptBuffers.
void Runner::Impl::KeepBuffer(std::unique_ptr<char[]> buf) {
  if (buf == nullptr || buffers.size() >= kKeptBuffers || shutting_down) return;
  buffers.push_back(std::move(buf));
  ArmIdle();
}

}  // namespace nsbox::exec
