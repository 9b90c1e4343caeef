package agent

import (
	"crypto/rand"
	"errors"
	"os"
	"testing"

	"golang.org/x/sys/unix"
)

// TestReseed runs the two ioctls on this host's kernel (as a VM's agent
// would: every error counts), so their encoding is checked against a real
// Linux. It needs root (CAP_SYS_ADMIN); crediting 64 bytes of fresh
// randomness and reseeding harms no host.
func TestReseed(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root (CAP_SYS_ADMIN) for RNDADDENTROPY")
	}
	inVM = true
	defer func() { inVM = false }()
	b := make([]byte, 64)
	rand.Read(b)
	err := reseed(b)
	if errors.Is(err, unix.EPERM) {
		t.Skipf("no CAP_SYS_ADMIN here: %v", err)
	}
	if err != nil {
		t.Fatal(err)
	}
	if err := reseed(make([]byte, 513)); err == nil {
		t.Error("513 bytes of entropy accepted")
	}
	// Outside a VM an unsupported ioctl is skipped, other errors are not.
	inVM = false
	if unsupported("X", unix.ENOTTY) != nil || unsupported("X", unix.EINVAL) != nil || unsupported("X", unix.EPERM) == nil {
		t.Error("outside a VM: ENOTTY and EINVAL are skipped, EPERM is an error")
	}
	inVM = true
	if unsupported("X", unix.ENOTTY) == nil {
		t.Error("in a VM: ENOTTY is an error")
	}
}
