// ty-exec runs a job's command in a Kubernetes pod so that the platform can tell its stderr from its stdout.
//
//	ty-exec -- command [args...]
//	ty-exec --copy-to DIR        (an init container: copy this binary to DIR/ty-exec)
//
// The pod log the kubelet serves merges both streams. ty-exec starts the command with stdin and stdout inherited
// and its stderr on a pipe; each stderr line is written to ty-exec's own stderr behind TAG (bytes 0x1F 0x02,
// ASCII control characters no program prints at the start of a line, and not line breaks to any reader), which the platform's log collector strips and files
// as stderr. Lines keep their order; a line of any length is passed through in pieces as it arrives (the tag only
// at its start); a last line without a newline gets one.
//
// Signals a container is sent (TERM, INT, HUP, QUIT, USR1, USR2) go on to the command. ty-exec exits with the
// command's exit code; a command killed by a signal is mirrored: ty-exec raises the same signal on itself (so the
// runtime sees the same termination), or, where that cannot kill it (PID 1 of the container), exits 128+signal.
// A command that cannot be started: a message (tagged, so it counts as stderr) and exit 127 (not found) or 126.
// As PID 1 it also reaps orphans the command leaves behind.
package main

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"
	"unsafe"
)

// TAG marks a line of the command's stderr in the merged pod log (jobs/backends/volcano.py: STDERR_TAG).
const TAG = "\x1f\x02"

// How long stderr is still read after the command ended (a child it left behind may hold the pipe open).
const drainAfterExit = 2 * time.Second

var forwarded = []os.Signal{
	syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP, syscall.SIGQUIT, syscall.SIGUSR1, syscall.SIGUSR2,
}

type taggedWriter struct {
	mu  sync.Mutex
	out io.Writer
}

// write passes b on; a failed write (the reader of our stderr gone) is dropped so the command never blocks.
func (w *taggedWriter) write(b []byte) {
	w.mu.Lock()
	defer w.mu.Unlock()
	_, _ = w.out.Write(b)
}

func (w *taggedWriter) say(format string, args ...any) {
	w.write([]byte(TAG + "ty-exec: " + fmt.Sprintf(format, args...) + "\n"))
}

// relay copies r to w line by line with TAG before each line, until EOF or an error (a read deadline).
func relay(r io.Reader, w *taggedWriter) {
	reader := bufio.NewReaderSize(r, 64*1024)
	atStart := true
	buf := make([]byte, 0, 64*1024+len(TAG)+1)
	for {
		chunk, err := reader.ReadSlice('\n')
		if len(chunk) > 0 {
			buf = buf[:0]
			if atStart {
				buf = append(buf, TAG...)
			}
			buf = append(buf, chunk...)
			w.write(buf)
			atStart = chunk[len(chunk)-1] == '\n'
		}
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			if !atStart {
				w.write([]byte("\n"))
			}
			return
		}
	}
}

func copyTo(dir string) int {
	self, err := os.Executable()
	if err == nil {
		var data []byte
		if data, err = os.ReadFile(self); err == nil {
			tmp := filepath.Join(dir, ".ty-exec.tmp")
			if err = os.WriteFile(tmp, data, 0o755); err == nil {
				if err = os.Chmod(tmp, 0o755); err == nil {
					err = os.Rename(tmp, filepath.Join(dir, "ty-exec"))
				}
			}
		}
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "ty-exec: cannot copy itself to %s: %v\n", dir, err)
		return 1
	}
	return 0
}

// startError is the exit code and message of a command that could not be started (the shell's conventions).
func startError(name string, err error) (int, string) {
	if errors.Is(err, exec.ErrNotFound) || errors.Is(err, fs.ErrNotExist) {
		return 127, fmt.Sprintf("cannot run %s: command not found", strconv.Quote(name))
	}
	return 126, fmt.Sprintf("cannot run %s: %v", strconv.Quote(name), err)
}

// raise ends ty-exec by sig, as its command ended, with the default action restored at the kernel (the Go
// runtime's own handler would turn some signals into an exit code); exits 128+sig where the signal does not kill.
func raise(sig syscall.Signal) {
	if os.Getpid() != 1 { // PID 1 of a namespace ignores signals it has no handler for
		_ = syscall.Setrlimit(syscall.RLIMIT_CORE, &syscall.Rlimit{}) // the command dumped its core already
		signal.Reset(sig)
		var dfl [4]uint64 // struct sigaction with SIG_DFL and no flags
		syscall.RawSyscall6(syscall.SYS_RT_SIGACTION, uintptr(sig), uintptr(unsafe.Pointer(&dfl)), 0, 8, 0, 0)
		_ = syscall.Kill(os.Getpid(), sig)
		time.Sleep(time.Second)
	}
	os.Exit(128 + int(sig))
}

func main() {
	args := os.Args[1:]
	if len(args) == 2 && args[0] == "--copy-to" {
		os.Exit(copyTo(args[1]))
	}
	if len(args) < 2 || args[0] != "--" {
		fmt.Fprintln(os.Stderr, "usage: ty-exec -- command [args...] | ty-exec --copy-to DIR")
		os.Exit(2)
	}
	os.Exit(run(args[1:]))
}

func run(argv []string) int {
	out := &taggedWriter{out: os.Stderr}
	signals := make(chan os.Signal, 64)
	signal.Notify(signals, append([]os.Signal{syscall.SIGCHLD}, forwarded...)...)
	// A write to a stderr nobody reads must not kill ty-exec (caught, not ignored: an ignored signal is inherited).
	signal.Notify(make(chan os.Signal, 1), syscall.SIGPIPE)

	cmd := exec.Command(argv[0], argv[1:]...)
	if errors.Is(cmd.Err, exec.ErrDot) {
		cmd.Err = nil // a command in the working directory named by PATH's ".": the shell would run it
	}
	reader, writer, err := os.Pipe()
	if err != nil {
		out.say("cannot make a pipe: %v", err)
		return 126
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, writer
	if err := cmd.Start(); err != nil {
		code, message := startError(argv[0], err)
		out.say("%s", message)
		return code
	}
	writer.Close()
	child := cmd.Process.Pid
	relayed := make(chan struct{})
	go func() {
		relay(reader, out)
		close(relayed)
	}()

	var status syscall.WaitStatus
	poll := time.NewTicker(time.Second) // a SIGCHLD lost to a full channel costs a second, never a hang
	defer poll.Stop()
	for exited := false; !exited; {
		select {
		case sig := <-signals:
			if sig != syscall.SIGCHLD {
				_ = syscall.Kill(child, sig.(syscall.Signal))
				continue
			}
		case <-poll.C:
		}
		for { // reap every child that ended: the command, and orphans when ty-exec is PID 1
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if err == syscall.EINTR {
				continue
			}
			if err != nil || pid <= 0 {
				break
			}
			if pid == child {
				status, exited = ws, true
			}
		}
	}
	// Signals still arrive while stderr drains: kept caught (and dropped), so ty-exec ends as its command did.
	select {
	case <-relayed:
	case <-time.After(drainAfterExit):
		_ = reader.SetReadDeadline(time.Now())
		<-relayed
	}
	if status.Signaled() {
		raise(status.Signal())
	}
	return status.ExitStatus()
}
