package firecracker

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"time"

	"golang.org/x/sys/unix"

	"github.com/spacesandbox/space/internal/errdefs"
)

// The request and response bodies of Firecracker's HTTP API, as documented
// in its swagger definition (src/firecracker/swagger/firecracker.yaml).
// Only the fields this driver sends are declared: Firecracker rejects
// unknown fields, so nothing speculative goes over the wire.

// bootSource is PUT /boot-source. kernel_image_path is required.
type bootSource struct {
	KernelImagePath string `json:"kernel_image_path"`
	InitrdPath      string `json:"initrd_path,omitempty"`
	BootArgs        string `json:"boot_args,omitempty"`
}

// drive is PUT /drives/{drive_id}. drive_id and is_root_device are
// required; path_on_host and is_read_only are required for virtio-block.
type drive struct {
	DriveID      string `json:"drive_id"`
	PathOnHost   string `json:"path_on_host"`
	IsRootDevice bool   `json:"is_root_device"`
	IsReadOnly   bool   `json:"is_read_only"`
}

// machineConfig is PUT /machine-config. Both fields are required; the
// optional ones (smt, track_dirty_pages, huge_pages) keep their defaults.
type machineConfig struct {
	VCPUCount  int `json:"vcpu_count"`
	MemSizeMiB int `json:"mem_size_mib"`
}

// vsockDevice is PUT /vsock. guest_cid (≥ 3) and uds_path are required.
type vsockDevice struct {
	GuestCID uint32 `json:"guest_cid"`
	UDSPath  string `json:"uds_path"`
}

// instanceAction is PUT /actions.
type instanceAction struct {
	ActionType string `json:"action_type"` // FlushMetrics | InstanceStart | SendCtrlAltDel
}

// vmState is PATCH /vm.
type vmState struct {
	State string `json:"state"` // Paused | Resumed
}

// snapshotCreate is PUT /snapshot/create (the VM must be Paused).
type snapshotCreate struct {
	SnapshotType string `json:"snapshot_type"` // Full | Diff
	SnapshotPath string `json:"snapshot_path"`
	MemFilePath  string `json:"mem_file_path"`
}

// memBackend is the mem_backend of PUT /snapshot/load.
type memBackend struct {
	BackendType string `json:"backend_type"` // File | Uffd
	BackendPath string `json:"backend_path"`
}

// snapshotLoad is PUT /snapshot/load (only on a fresh process). Dirty page
// tracking (enable_diff_snapshots, deprecated in favour of
// track_dirty_pages) is left off: this driver takes Full snapshots only.
type snapshotLoad struct {
	SnapshotPath string     `json:"snapshot_path"`
	MemBackend   memBackend `json:"mem_backend"`
	ResumeVM     bool       `json:"resume_vm"`
}

// instanceInfo is the answer of GET /.
type instanceInfo struct {
	AppName    string `json:"app_name"`
	ID         string `json:"id"`
	State      string `json:"state"` // "Not started" | "Running" | "Paused"
	VMMVersion string `json:"vmm_version"`
}

// API enum values.
const (
	actionInstanceStart = "InstanceStart"
	statePaused         = "Paused"  // PATCH /vm, and GET / state
	stateResumed        = "Resumed" // PATCH /vm
	stateRunning        = "Running" // GET / state
	stateNotStarted     = "Not started"
	snapshotFull        = "Full"
	backendFile         = "File"
)

// APIError is an error answer of Firecracker's API: a non-2xx status with
// a JSON body {"fault_message": "..."}. It is of class errdefs.ErrInternal:
// a refused call is the driver's or the VMM's failure, never the user's.
type APIError struct {
	Method, Path string
	Status       int
	Fault        string // fault_message, or the raw body when it was not JSON
}

func (e *APIError) Error() string {
	return fmt.Sprintf("firecracker: %s %s: %d %s: %s", e.Method, e.Path, e.Status, http.StatusText(e.Status), e.Fault)
}

// Unwrap makes an APIError an errdefs.ErrInternal.
func (e *APIError) Unwrap() error { return errdefs.ErrInternal }

// apiClient talks to one Firecracker process over its API socket. Every
// request gets its own connection: the API server is a small single-threaded
// HTTP/1.1 server and a kept-alive connection buys nothing here.
type apiClient struct {
	sock string
	hc   *http.Client
}

func newAPIClient(sock string) *apiClient {
	return &apiClient{sock: sock, hc: &http.Client{Transport: &http.Transport{
		DialContext:       func(ctx context.Context, _, _ string) (net.Conn, error) { return dialUnix(ctx, sock) },
		DisableKeepAlives: true,
	}}}
}

// do sends one request. body, when not nil, is sent as JSON; out, when not
// nil, receives the JSON answer. Errors: *APIError for an error answer,
// errdefs.ErrUnavailable when the socket does not answer (the process is
// gone or not listening yet).
func (c *apiClient) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return fmt.Errorf("firecracker: %s %s: %w", method, path, err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://localhost"+path, rd)
	if err != nil {
		return fmt.Errorf("firecracker: %s %s: %w", method, path, err)
	}
	req.Header.Set("Accept", "application/json")
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return fmt.Errorf("firecracker: %s %s: %w", method, path, ctx.Err())
		}
		return fmt.Errorf("firecracker: %s %s: %v: %w", method, path, err, errdefs.ErrUnavailable)
	}
	defer resp.Body.Close()
	data, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode/100 != 2 {
		e := &APIError{Method: method, Path: path, Status: resp.StatusCode}
		var fault struct {
			FaultMessage string `json:"fault_message"`
		}
		if json.Unmarshal(data, &fault) == nil && fault.FaultMessage != "" {
			e.Fault = fault.FaultMessage
		} else {
			e.Fault = string(bytes.TrimSpace(data))
		}
		return e
	}
	if out != nil {
		if err := json.Unmarshal(data, out); err != nil {
			return fmt.Errorf("firecracker: %s %s: bad answer: %w", method, path, err)
		}
	}
	return nil
}

// info is GET /.
func (c *apiClient) info(ctx context.Context) (instanceInfo, error) {
	var info instanceInfo
	err := c.do(ctx, http.MethodGet, "/", nil, &info)
	return info, err
}

// apiCall is one step of a request sequence: the boot of a VM is data (a
// list of these), so it can be read, logged and tested as a whole.
type apiCall struct {
	Method, Path string
	Body         any
}

// run sends calls in order and stops at the first error.
func (c *apiClient) run(ctx context.Context, calls []apiCall) error {
	for _, s := range calls {
		if err := c.do(ctx, s.Method, s.Path, s.Body, nil); err != nil {
			return err
		}
	}
	return nil
}

// maxSunPath is the longest unix socket path connect(2) takes (sun_path is
// 108 bytes with its NUL).
const maxSunPath = 107

// dialUnix connects to the unix socket at path. Paths too long for
// sun_path (state directories nest deep, the jail deeper) are reached
// through /proc/self/fd/<dirfd>/<name> of their directory.
func dialUnix(ctx context.Context, path string) (net.Conn, error) {
	var d net.Dialer
	if len(path) <= maxSunPath {
		return d.DialContext(ctx, "unix", path)
	}
	dir, err := os.OpenFile(filepath.Dir(path), unix.O_PATH|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	defer dir.Close()
	short := fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path))
	if len(short) > maxSunPath {
		return nil, fmt.Errorf("socket name %q too long", filepath.Base(path))
	}
	return d.DialContext(ctx, "unix", short)
}

// waitAPI waits until the API socket answers GET / (bounded by ctx and by
// limit), failing early when gone reports that the process died.
func waitAPI(ctx context.Context, c *apiClient, limit time.Duration, gone func() bool) (instanceInfo, error) {
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	wait := 2 * time.Millisecond
	for {
		info, err := c.info(ctx)
		if err == nil {
			return info, nil
		}
		var apiErr *APIError
		if errors.As(err, &apiErr) {
			return info, err // it answered, with an error: nothing to wait for
		}
		if gone() {
			return info, fmt.Errorf("firecracker exited before its API answered: %w", errdefs.ErrUnavailable)
		}
		select {
		case <-time.After(wait):
		case <-ctx.Done():
			return info, fmt.Errorf("firecracker API did not answer within %s: %v: %w", limit, err, errdefs.ErrUnavailable)
		}
		wait = min(wait*2, 50*time.Millisecond)
	}
}
