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
