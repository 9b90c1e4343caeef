package server

import (
	"reflect"
	"strings"
	"testing"
)

func TestParsePoolDrivers(t *testing.T) {
	tests := []struct {
		in      string
		want    []PoolSpec
		wantErr string
	}{
		{"", nil, ""},
		{"  ", nil, ""},
		{"qemu=2", []PoolSpec{{Driver: "qemu", Size: 2}}, ""},
		{"qemu=2:256, gvisor=0", []PoolSpec{{Driver: "qemu", Size: 2, MemoryMB: 256}, {Driver: "gvisor", Size: 0}}, ""},
		{"firecracker=64", []PoolSpec{{Driver: "firecracker", Size: 64}}, ""},
		{"qemu", nil, "no DRIVER=N"},
		{"=2", nil, "no DRIVER=N"},
		{"qemu=", nil, "size must be a number"},
		{"qemu=x", nil, "size must be a number"},
		{"qemu=-1", nil, "size must be a number"},
		{"qemu=65", nil, "size must be a number"},
		{"qemu=2:", nil, "memory must be"},
		{"qemu=2:64", nil, "memory must be"},
		{"qemu=2:lots", nil, "memory must be"},
		{"kvm=2", nil, `unknown driver "kvm"`},
		{"qemu=1,qemu=2", nil, "given twice"},
		{"qemu=1,", nil, "no DRIVER=N"},
		{"qemu=1:256:2", []PoolSpec{{Driver: "qemu", Size: 1, MemoryMB: 256, CPU: 2}}, ""},
		{"qemu=1::2", []PoolSpec{{Driver: "qemu", Size: 1, CPU: 2}}, ""},
		{"qemu=1:256:0", nil, "CPUs must be a number from 1 to 8"},
		{"qemu=1::9", nil, "CPUs must be a number from 1 to 8"},
		{"qemu=1:256:2:1", nil, "more than N:MEMORY_MB:CPUS"},
	}
	for _, tt := range tests {
		got, err := ParsePoolDrivers(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "--pool-drivers") {
				t.Errorf("ParsePoolDrivers(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParsePoolDrivers(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

func TestValidateOnOff(t *testing.T) {
	var c Config
	c.Defaults()
	if err := c.Validate(); err != nil || c.QEMUCgroups != "on" || c.CheckpointOnPause != "on" {
		t.Fatalf("defaults: %v (%q, %q)", err, c.QEMUCgroups, c.CheckpointOnPause)
	}
	c.QEMUCgroups, c.CheckpointOnPause = "off", "off"
	if err := c.Validate(); err != nil {
		t.Fatal(err)
	}
	c.QEMUCgroups = "of"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--qemu-cgroups") {
		t.Fatalf("typo accepted: %v", err)
	}
	c.QEMUCgroups, c.CheckpointOnPause = "on", "yes"
	if err := c.Validate(); err == nil || !strings.Contains(err.Error(), "--checkpoint-on-pause") {
		t.Fatalf("typo accepted: %v", err)
	}
}

func TestParsePools(t *testing.T) {
	tests := []struct {
		in      string
		want    []PoolSpec
		wantErr string
	}{
		{"", nil, ""},
		{"python-data=2", []PoolSpec{{Template: "python-data", Size: 2}}, ""},
		{" python-data=2:1024 , base@qemu=1:512, base=0", []PoolSpec{
			{Template: "python-data", Size: 2, MemoryMB: 1024},
			{Template: "base", Driver: "qemu", Size: 1, MemoryMB: 512},
			{Template: "base", Size: 0},
		}, ""},
		{"python-data", nil, "no TEMPLATE[@DRIVER]=N"},
		{"=1", nil, "no TEMPLATE[@DRIVER]=N"},
		{"pandas=1", nil, `unknown template "pandas" (known: base, python-data)`},
		{"base@kvm=1", nil, `unknown driver "kvm"`},
		{"base@=1", nil, `unknown driver ""`},
		{"python-data=1,python-data=3", nil, "given twice"},
		{"python-data=65", nil, "size must be a number"},
		{"python-data=1:100", nil, "memory must be"},
		{"python-data@gvisor=1:2048:2", []PoolSpec{{Template: "python-data", Driver: "gvisor", Size: 1, MemoryMB: 2048, CPU: 2}}, ""},
		{"python-data=1::x", nil, "CPUs must be"},
	}
	for _, tt := range tests {
		got, err := ParsePools(tt.in)
		if tt.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), tt.wantErr) || !strings.Contains(err.Error(), "--pools") {
				t.Errorf("ParsePools(%q) = %v, %v; want an error with %q", tt.in, got, err, tt.wantErr)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(got, tt.want) {
			t.Errorf("ParsePools(%q) = %+v, %v; want %+v", tt.in, got, err, tt.want)
		}
	}
}

// TestPoolConfigs: --pool-size, --pool-drivers and --pools make one list,
// later flags replacing earlier ones for the same template and driver.
func TestPoolConfigs(t *testing.T) {
	cfg := Config{Driver: "gvisor", DefaultTemplate: "base", PoolSize: 2}
	type pc struct {
		tpl, drv       string
		size, mem, cpu int
	}
	for _, c := range []struct {
		drivers, pools string
		want           []pc
		wantErr        string
	}{
		{"", "", []pc{{"base", "gvisor", 2, 0, 0}}, ""},
		{"qemu=1", "", []pc{{"base", "gvisor", 2, 0, 0}, {"base", "qemu", 1, 0, 0}}, ""},
		{"gvisor=3:512", "", []pc{{"base", "gvisor", 3, 512, 0}}, ""},
		{"gvisor=0", "", nil, ""},
		{"", "python-data=1", []pc{{"base", "gvisor", 2, 0, 0}, {"python-data", "gvisor", 1, 0, 0}}, ""},
		{"qemu=1", "base@qemu=0,base=4,python-data@qemu=1:1024", []pc{{"base", "gvisor", 4, 0, 0}, {"python-data", "qemu", 1, 1024, 0}}, ""},
		{"", "base=1,base@gvisor=2", nil, "template base on driver gvisor given twice"},
		{"", "python-data=1:1024:2", []pc{{"base", "gvisor", 2, 0, 0}, {"python-data", "gvisor", 1, 1024, 2}}, ""},
	} {
		drv, err := ParsePoolDrivers(c.drivers)
		if err != nil {
			t.Fatal(err)
		}
		tpl, err := ParsePools(c.pools)
		if err != nil {
			t.Fatal(err)
		}
		got, err := poolConfigs(cfg, drv, tpl)
		if c.wantErr != "" {
			if err == nil || !strings.Contains(err.Error(), c.wantErr) {
				t.Errorf("%q %q: %v, want an error with %q", c.drivers, c.pools, err, c.wantErr)
			}
			continue
		}
		var have []pc
		for _, p := range got {
			have = append(have, pc{p.Template, p.Driver, p.Size, p.MemoryMB, p.CPU})
			if p.FromImage != (p.Driver == "qemu") {
				t.Errorf("%q %q: %+v refills from an image: %v", c.drivers, c.pools, p, p.FromImage)
			}
		}
		if err != nil || !reflect.DeepEqual(have, c.want) {
			t.Errorf("%q %q: %+v, %v; want %+v", c.drivers, c.pools, have, err, c.want)
		}
	}
}
