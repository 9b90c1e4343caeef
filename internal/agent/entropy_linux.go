package agent

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"unsafe"

	"golang.org/x/sys/unix"
)

// inVM is set when the agent runs as a VM's init (--init): there the
// guest kernel is Linux and every entropy ioctl must work.
var inVM bool

// reseed credits host entropy to the guest kernel's pool and forces its
// CRNG to reseed. A memory restore clones the kernel's RNG state into
// every VM made from one image: writing to /dev/urandom only mixes the
// bytes into the input pool, which the CRNG reads at its next scheduled
// reseed (up to a minute later), so until then the clones would hand
// out the same "random" bytes. RNDRESEEDCRNG makes the new key now.
//
// Outside a VM (gVisor: the RNG is the host's) a kernel without these
// ioctls answers ENOTTY or EINVAL, which is ignored; any other error, and
// any error in a VM, is returned.
func reseed(entropy []byte) error {
	if len(entropy) > 512 {
		return fmt.Errorf("reseed: %d bytes of entropy, at most 512: %w", len(entropy), unix.EINVAL)
	}
	f, err := os.OpenFile("/dev/urandom", os.O_WRONLY, 0)
	if err != nil {
		return fmt.Errorf("reseed: %w", err)
	}
	defer f.Close()
	// struct rand_pool_info { int entropy_count; int buf_size; __u32 buf[]; }
	buf := make([]byte, 8+(len(entropy)+3)/4*4)
	binary.NativeEndian.PutUint32(buf[0:], uint32(len(entropy)*8))
	binary.NativeEndian.PutUint32(buf[4:], uint32(len(entropy)))
	copy(buf[8:], entropy)
	fd := f.Fd()
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, unix.RNDADDENTROPY, uintptr(unsafe.Pointer(&buf[0]))); e != 0 {
		return unsupported("RNDADDENTROPY", e)
	}
	if _, _, e := unix.Syscall(unix.SYS_IOCTL, fd, unix.RNDRESEEDCRNG, 0); e != 0 {
		return unsupported("RNDRESEEDCRNG", e)
	}
	return nil
}

// unsupported returns nil for "no such ioctl" outside a VM, else an error.
func unsupported(op string, e unix.Errno) error {
	if !inVM && (errors.Is(e, unix.ENOTTY) || errors.Is(e, unix.EINVAL)) {
		return nil
	}
	return fmt.Errorf("reseed: %s: %w", op, e)
}
