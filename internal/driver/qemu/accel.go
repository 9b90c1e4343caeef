package qemu

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"time"
)

// Accelerators.
const (
	AccelKVM = "kvm"
	AccelTCG = "tcg"
)

// chooseAccel is the accelerator decision: KVM only when the device exists
// and a real guest booted under it; TCG otherwise. The presence of
// /dev/kvm alone proves nothing (nested PVM hosts expose a /dev/kvm on
// which a stock kernel aborts or crawls).
func chooseAccel(kvmDevice bool, probeErr error) string {
	if kvmDevice && probeErr == nil {
		return AccelKVM
	}
	return AccelTCG
}

// probeTimeout bounds the KVM probe boot. A working KVM gets the kernel to
// its "no root filesystem" panic in well under a second.
const probeTimeout = 8 * time.Second

var (
	probeMu    sync.Mutex
	probeCache = map[string]string{}
)

// probeAccel returns the accelerator to use with qemuBin and kernel,
// probing once per process.
func probeAccel(ctx context.Context, qemuBin, kernel string) (accel, why string) {
	probeMu.Lock()
	defer probeMu.Unlock()
	key := qemuBin + "\x00" + kernel
	if a, ok := probeCache[key]; ok {
		return a, "cached probe"
	}
	_, statErr := os.Stat("/dev/kvm")
	var err error
	if statErr == nil {
		err = probeKVM(ctx, qemuBin, kernel)
	} else {
		err = statErr
	}
	a := chooseAccel(statErr == nil, err)
	probeCache[key] = a
	if err != nil {
		return a, err.Error()
	}
	return a, "kvm boot probe succeeded"
}

// probeKVM boots kernel under KVM with no root filesystem: success is the
// kernel reaching its panic (then -no-reboot makes QEMU exit).
func probeKVM(ctx context.Context, qemuBin, kernel string) error {
	ctx, cancel := context.WithTimeout(ctx, probeTimeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, qemuBin,
		"-M", "microvm,accel=kvm,acpi=on", "-cpu", "host", "-m", "128", "-smp", "1",
		"-nodefaults", "-no-user-config", "-display", "none", "-no-reboot",
		"-serial", "stdio", "-kernel", kernel,
		"-append", "console=ttyS0 panic=-1 quiet")
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	cmd.WaitDelay = time.Second
	err := cmd.Run()
	s := out.String()
	if strings.Contains(s, "Kernel panic") {
		return nil
	}
	if ctx.Err() != nil {
		return fmt.Errorf("kvm probe: no guest panic within %s", probeTimeout)
	}
	if len(s) > 300 {
		s = s[len(s)-300:]
	}
	return fmt.Errorf("kvm probe: %v: %s", err, strings.TrimSpace(s))
}
