package agent

import (
	"fmt"
	"os"

	"golang.org/x/sys/unix"
)

// openPTY opens a terminal pair whose master is non-blocking, so reads of
// it park in Go's poller. creack/pty's Open and Setsize call Fd(), which
// puts the master back in blocking mode: every terminal then held an OS
// thread in a read, and ~200 of them used up the agent's task limit (the
// Go runtime cannot survive failing to start a thread: the agent, and the
// sandbox, died).
func openPTY() (master, tty *os.File, err error) {
	fd, err := unix.Open("/dev/ptmx", unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC|unix.O_NONBLOCK, 0)
	if err != nil {
		return nil, nil, fmt.Errorf("open /dev/ptmx: %w", err)
	}
	n, err := unix.IoctlGetInt(fd, unix.TIOCGPTN)
	if err == nil {
		err = unix.IoctlSetPointerInt(fd, unix.TIOCSPTLCK, 0)
	}
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("pty: %w", err)
	}
	name := fmt.Sprintf("/dev/pts/%d", n)
	tfd, err := unix.Open(name, unix.O_RDWR|unix.O_NOCTTY|unix.O_CLOEXEC, 0)
	if err != nil {
		unix.Close(fd)
		return nil, nil, fmt.Errorf("open %s: %w", name, err)
	}
	// A non-blocking descriptor is registered with the poller.
	return os.NewFile(uintptr(fd), "/dev/ptmx"), os.NewFile(uintptr(tfd), name), nil
}

// setWinsize sets a terminal's size through the master without taking it
// out of non-blocking mode.
func setWinsize(master *os.File, rows, cols uint16) error {
	sc, err := master.SyscallConn()
	if err != nil {
		return err
	}
	var ierr error
	if err := sc.Control(func(fd uintptr) {
		ierr = unix.IoctlSetWinsize(int(fd), unix.TIOCSWINSZ, &unix.Winsize{Row: rows, Col: cols})
	}); err != nil {
		return err
	}
	return ierr
}
