package qemu

import (
	"errors"
	"strings"
	"testing"
)

func TestChooseAccel(t *testing.T) {
	for _, c := range []struct {
		dev   bool
		probe error
		want  string
	}{
		{true, nil, AccelKVM},
		// /dev/kvm exists but a guest does not boot (nested PVM here).
		{true, errors.New("failed to set MSR 0x10a"), AccelTCG},
		{false, errors.New("stat /dev/kvm: no such file"), AccelTCG},
		{false, nil, AccelTCG},
	} {
		if got := chooseAccel(c.dev, c.probe); got != c.want {
			t.Errorf("chooseAccel(%v, %v) = %s, want %s", c.dev, c.probe, got, c.want)
		}
	}
}

func TestCmdlineTSC(t *testing.T) {
	d := &Driver{accel: AccelTCG, tscKHz: 2095999}
	if c := d.cmdline("box"); !strings.Contains(c, "tsc_early_khz=2095999") || !strings.Contains(c, "space.hostname=box") || !strings.Contains(c, "-- --init --serial") {
		t.Errorf("tcg cmdline %q", c)
	}
	d.accel = AccelKVM
	if c := d.cmdline("box"); strings.Contains(c, "tsc_early_khz") {
		t.Errorf("kvm cmdline has tsc_early_khz: %q", c)
	}
	if hostTSCkHz() <= 0 {
		t.Errorf("host TSC frequency unknown (needed under TCG)")
	}
}
