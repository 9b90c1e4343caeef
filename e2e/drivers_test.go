package e2e

import (
	"os/exec"
	"slices"
	"sync"
	"testing"

	"github.com/spacesandbox/space/internal/driver"
	"github.com/spacesandbox/space/internal/testenv"
)

// Driver-parameterised tests: the API and snapshot tests run once per
// sandbox driver, as subtests named by the driver, on the one shared server
// (started with both drivers enabled, gVisor the default).
//
// A QEMU sandbox boots a real kernel, under TCG here: seconds of CPU per
// boot on 2 cores, and a few percent of a core per idle VM. So tests that
// leave their sandbox usable share one VM (sharedSandbox), VMs get
// vmMemoryMB, and tests destroy the VMs they made for themselves.

// testDrivers are the drivers forEachDriver runs a test on.
var testDrivers = []string{"gvisor", "qemu"}

// vmMemoryMB is the memory of every VM the tests boot: enough for the
// base template's tools, small enough for a quick checkpoint.
const vmMemoryMB = 256

// driverLacks lists, per driver, the optional capabilities (the driver's
// Capabilities().Features) it does not have; tests of such an operation
// check instead that the API refuses it clearly.
var driverLacks = map[string][]string{
	"qemu": {driver.CapFilesSnapshot}, // a VM's disk is one image: no writable layer to export
}

// capable reports whether driver drv has the optional capability.
func capable(drv, capability string) bool {
	return !slices.Contains(driverLacks[drv], capability)
}

// forEachDriver runs f once per driver as subtest t.Run(drv). A qemu
// subtest first checks the VM tools and guest kernel (testenv.QEMU says
// what to install when they are missing).
func forEachDriver(t *testing.T, f func(t *testing.T, drv string)) {
	t.Helper()
	for _, drv := range testDrivers {
		t.Run(drv, func(t *testing.T) {
			if drv == "qemu" {
				testenv.QEMU(t)
			}
			f(t, drv)
		})
	}
}

// sharedServerDrivers are the flags of the shared server: every driver this
// host can run, so one server serves every subtest (a host without QEMU
// still runs the gVisor subtests; the qemu ones fail in testenv.QEMU,
// saying what to install).
func sharedServerDrivers() []string {
	if _, err := exec.LookPath("qemu-system-x86_64"); err != nil {
		return nil
	}
	return []string{"--drivers", "gvisor,qemu"}
}

// createOn creates a sandbox of driver drv with body (which it may
// extend); a VM gets vmMemoryMB unless body sets memory_mb. A VM is
// destroyed when t ends: idle VMs cost CPU under TCG.
func (s *server) createOn(t *testing.T, drv string, body map[string]any) string {
	t.Helper()
	if body == nil {
		body = map[string]any{}
	}
	body["driver"] = drv
	if drv == "qemu" {
		if _, ok := body["memory_mb"]; !ok {
			body["memory_mb"] = vmMemoryMB
		}
	}
	id := s.create(body)
	if drv == "qemu" {
		t.Cleanup(func() { s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil) })
	}
	return id
}

// sharedVMEnv is the env of the shared VM: what any test using it expects.
var sharedVMEnv = map[string]string{"GREETING": "hi"}

var (
	sharedVMMu sync.Mutex
	sharedVM   string
)

// sharedSandbox returns a running sandbox of driver drv for a test that
// leaves it usable (its files under distinct paths, its background
// processes ended, not paused): on gVisor a fresh one (cheap: the warm
// pool), on qemu one VM on the shared server reused by every such test.
// Both have sharedVMEnv in their env.
func (s *server) sharedSandbox(t *testing.T, drv string) string {
	t.Helper()
	if drv != "qemu" {
		return s.createOn(t, drv, map[string]any{"env": sharedVMEnv})
	}
	sharedVMMu.Lock()
	defer sharedVMMu.Unlock()
	if sharedVM != "" {
		var sb sandboxView
		s.do("GET", "/v1/sandboxes/"+sharedVM, s.key, nil, &sb)
		if sb.State == "paused" { // a test failed between pause and resume
			s.do("POST", "/v1/sandboxes/"+sharedVM+"/resume", s.key, nil, &sb)
		}
		if sb.State == "running" {
			return sharedVM
		}
	}
	// It lives as long as the suite needs it (releaseSharedVM ends it):
	// with the default 300 s timeout a slow run saw it stopped mid-test.
	sharedVM = s.create(map[string]any{"driver": drv, "memory_mb": vmMemoryMB, "env": sharedVMEnv, "timeout_s": 3600})
	return sharedVM
}

// releaseSharedVM destroys the shared VM, so it does not idle through the
// rest of the suite; the next sharedSandbox call boots a new one.
func (s *server) releaseSharedVM() {
	sharedVMMu.Lock()
	defer sharedVMMu.Unlock()
	if sharedVM != "" {
		s.do("DELETE", "/v1/sandboxes/"+sharedVM, s.key, nil, nil)
		sharedVM = ""
	}
}

// notSupported checks that a call answered 501 not_supported naming the
// driver: a clear refusal, never a silent no-op.
func notSupported(t *testing.T, what string, code int, e apiError, drv string) {
	t.Helper()
	if code != 501 || e.Error != "not_supported" || e.Message == "" {
		t.Errorf("%s on %s: %d %+v, want 501 not_supported", what, drv, code, e)
	}
}
