package firecracker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// Firecracker has no fallback accelerator: it needs a /dev/kvm on which a
// guest really runs. The device existing proves little (a nested PVM host
// exposes a /dev/kvm on which stock kernels do not boot), so the decision
// takes two steps: the device must open and create a VM (cheap ioctls), and
// then the real firecracker binary must boot the real guest kernel to its
// "no root filesystem" panic.

// KVM ioctls (linux/kvm.h).
const (
	kvmGetAPIVersion = 0xAE00 // _IO(KVMIO, 0x00)
	kvmCreateVM      = 0xAE01 // _IO(KVMIO, 0x01)
	kvmAPIVersion    = 12
)

// kvmDevice checks that path (/dev/kvm) opens read-write, speaks the
// stable KVM API and lets this process create a VM.
func kvmDevice(path string) error {
	fd, err := unix.Open(path, unix.O_RDWR|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("open %s: %w", path, err)
	}
	defer unix.Close(fd)
	v, err := unix.IoctlRetInt(fd, kvmGetAPIVersion)
	if err != nil {
		return fmt.Errorf("%s: KVM_GET_API_VERSION: %w", path, err)
	}
	if v != kvmAPIVersion {
		return fmt.Errorf("%s: KVM API version %d, want %d", path, v, kvmAPIVersion)
	}
	vm, err := unix.IoctlRetInt(fd, kvmCreateVM)
	if err != nil {
		return fmt.Errorf("%s: KVM_CREATE_VM: %w", path, err)
	}
	unix.Close(vm)
	return nil
}

// kvmVerdict combines the two probe steps into the reason KVM is not
// usable, or nil when it is. A boot probe only counts when the device
// check passed (it is not run otherwise).
func kvmVerdict(deviceErr, bootErr error) error {
	switch {
	case deviceErr != nil:
		return deviceErr
	case bootErr != nil:
		return bootErr
	}
	return nil
}

// probeTimeout bounds the boot probe. Under working KVM the kernel reaches
// its panic in well under a second.
const probeTimeout = 10 * time.Second

var (
	probeMu    sync.Mutex
	probeCache = map[string]error{}
)

// probeKVM reports why firecracker cannot run guests on this host (nil if
// it can), probing once per process for a given binary and kernel.
func probeKVM(ctx context.Context, firecracker, kernel string) error {
	probeMu.Lock()
	defer probeMu.Unlock()
	key := firecracker + "\x00" + kernel
	if err, ok := probeCache[key]; ok {
		return err
	}
	devErr := kvmDevice("/dev/kvm")
	var bootErr error
	if devErr == nil {
		bootErr = probeBoot(ctx, firecracker, kernel)
	}
	err := kvmVerdict(devErr, bootErr)
	probeCache[key] = err
	return err
}

// probeBoot boots kernel with no disk and no initrd through firecracker's
// --no-api mode: success is the kernel reaching its panic (reboot=k
// panic=-1 then make firecracker exit at once).
func probeBoot(ctx context.Context, firecracker, kernel string) error {
	dir, err := os.MkdirTemp("", "space-fc-probe-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	cfg := map[string]any{
		"boot-source": bootSource{
			KernelImagePath: kernel,
			BootArgs:        "console=ttyS0 reboot=k panic=-1 pci=off i8042.noaux i8042.nomux i8042.dumbkbd",
		},
		"drives":         []drive{},
		"machine-config": machineConfig{VCPUCount: 1, MemSizeMiB: 128},
	}
	b, _ := json.Marshal(cfg)
	cfgPath := filepath.Join(dir, "probe.json")
	if err := os.WriteFile(cfgPath, b, 0o600); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, firecracker, "--no-api", "--config-file", cfgPath, "--id=space-kvm-probe")
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	runErr := cmd.Run()
	s := out.String()
	if strings.Contains(s, "Kernel panic") {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("kvm boot probe: no guest panic within %s", probeTimeout)
	}
	if runErr == nil {
		runErr = errors.New("exited without a guest panic")
	}
	if len(s) > 400 {
		s = s[len(s)-400:]
	}
	return fmt.Errorf("kvm boot probe: %v: %s", runErr, strings.TrimSpace(s))
}
