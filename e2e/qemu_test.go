package e2e

import (
	"fmt"
	"strings"
	"testing"

	"github.com/spacesandbox/space/internal/testenv"
)

// The QEMU driver runs the whole API and snapshot suite (forEachDriver in
// api_test.go and snapshot_test.go); this file holds what only VMs need.

// TestQEMUEgress: a VM has no NIC, only loopback. With a network policy its
// agent opens the same loopback endpoint as under gVisor and tunnels each
// connection over the agent's session (virtio-serial here) to the host
// proxy: the policy, the TLS interception with the sandbox's CA (installed
// in the VM's trust store) and the secret swap all apply. A fork child (a
// restored VM) keeps egress with its own placeholder; a VM without a
// policy has no way out until one is set.
func TestQEMUEgress(t *testing.T) {
	testenv.QEMU(t)
	const value = "vm-s3cr3t-VALUE-never-inside"
	up := startUpstream(t, "Bearer "+value)
	s := startServer(t, "", "--drivers", "gvisor,qemu", "--egress-hosts", "allowed.test=127.0.0.1,other.test=127.0.0.1",
		"--egress-allow-cidr", "127.0.0.1/32", "--egress-root-ca", up.caFile, "--pool-size", "-1", "--snapshot-interval", "-1")
	if code := s.do("POST", "/v1/secrets", s.key, map[string]any{
		"name": "VM_TOKEN", "value": value, "hosts": []string{fmt.Sprintf("allowed.test:%d", up.port)}, // a secret goes only to the ports it names
		"inject": map[string]string{"header": "Authorization", "format": "Bearer {value}"},
	}, nil); code != 201 {
		t.Fatalf("put secret: %d", code)
	}
	allowed := fmt.Sprintf("allowed.test:%d", up.port)
	other := fmt.Sprintf("other.test:%d", up.port)
	id := s.createOn(t, "qemu", map[string]any{"network": map[string]any{"allow": []string{allowed}}, "secrets": []string{"VM_TOKEN"}})

	// Loopback only: no NIC, no route.
	if r := s.sh(id, "ls /sys/class/net; tail -n +2 /proc/net/route | wc -l"); r.Stdout != "lo\n0\n" {
		t.Errorf("VM network interfaces and routes: %+v", r)
	}
	ph := strings.TrimSpace(s.sh(id, "echo $VM_TOKEN").Stdout)
	if !strings.HasPrefix(ph, "space_ph_") {
		t.Fatalf("VM_TOKEN inside = %q", ph)
	}
	// Through the proxy: the VM trusts the sandbox's CA, the upstream sees
	// the real value.
	r := s.sh(id, fmt.Sprintf(`curl -sS -H "Authorization: Bearer $VM_TOKEN" https://%s/vm 2>&1`, allowed))
	if r.ExitCode != 0 || !strings.Contains(r.Stdout, "path=/vm auth=valid") {
		t.Fatalf("curl from the VM to the allowed host: %+v", r)
	}
	// Another host is refused by the proxy.
	r = s.sh(id, fmt.Sprintf(`curl -sS https://%s/ 2>&1; echo rc=$?`, other))
	if strings.Contains(r.Stdout, "host=") || (!strings.Contains(r.Stdout, "rc=56") && !strings.Contains(r.Stdout, "403")) {
		t.Errorf("disallowed host from the VM: %+v", r)
	}
	// Around the proxy there is nothing: no resolver, no route.
	r = s.sh(id, fmt.Sprintf(`curl -sS --noproxy '*' --max-time 5 https://%s/ 2>&1; echo rc=$?`, allowed))
	if strings.Contains(r.Stdout, "host=") || strings.Contains(r.Stdout, "rc=0") {
		t.Errorf("direct connection from the VM bypassed the proxy: %+v", r)
	}
	var log struct {
		Records []struct{ Host, Decision, Secret string }
	}
	s.do("GET", "/v1/sandboxes/"+id+"/egress", s.key, nil, &log)
	var allow, deny, usedSecret bool
	for _, rec := range log.Records {
		allow = allow || rec.Decision == "allow"
		deny = deny || rec.Decision == "deny"
		usedSecret = usedSecret || rec.Secret == "VM_TOKEN"
	}
	if !allow || !deny || !usedSecret {
		t.Errorf("audit log of the VM: allow %v deny %v secret %v: %+v", allow, deny, usedSecret, log.Records)
	}

	// A fork child is a restored VM: its agent's endpoint came along in
	// its memory and tunnels to the host again, with its own placeholder.
	var fk struct{ Sandboxes []sandboxView }
	if code := s.do("POST", "/v1/sandboxes/"+id+"/fork", s.key, map[string]int{"count": 1}, &fk); code != 201 || len(fk.Sandboxes) != 1 {
		t.Fatalf("fork the VM: %d %+v", code, fk)
	}
	kid := fk.Sandboxes[0].ID
	t.Cleanup(func() { s.do("DELETE", "/v1/sandboxes/"+kid, s.key, nil, nil) })
	if kph := strings.TrimSpace(s.sh(kid, "bash -lc 'echo $VM_TOKEN'").Stdout); kph == ph || !strings.HasPrefix(kph, "space_ph_") {
		t.Errorf("fork child's placeholder %q (parent %q)", kph, ph)
	}
	if r := s.sh(kid, fmt.Sprintf(`curl -sS -H "Authorization: Bearer $VM_TOKEN" https://%s/kid 2>&1`, allowed)); !strings.Contains(r.Stdout, "path=/kid auth=valid") {
		t.Errorf("fork child through the proxy: %+v", r)
	}
	s.do("DELETE", "/v1/sandboxes/"+kid, s.key, nil, nil)
	s.do("DELETE", "/v1/sandboxes/"+id, s.key, nil, nil)

	// Without a policy a VM has no way out: no endpoint, no resolver, no
	// route (its 127.0.0.1 is its own loopback, not the host's).
	plain := s.createOn(t, "qemu", nil)
	s.put(plain, "/home/user/upstream-ca.pem", strings.NewReader(up.caPEM))
	for _, c := range []string{
		fmt.Sprintf("curl -sS --max-time 5 https://%s/", allowed),
		"curl -sS --max-time 2 http://127.0.0.1:3128/",
		fmt.Sprintf("curl -sS --max-time 2 --cacert upstream-ca.pem https://127.0.0.1:%d/", up.port),
		`python3 -c "import socket; socket.create_connection(('10.0.2.2', 80), timeout=2)"`,
	} {
		if r := s.sh(plain, c); r.ExitCode == 0 || strings.Contains(r.Stdout, "host=") {
			t.Errorf("VM without a policy reached out with %s: %+v", c, r)
		}
	}
	// A policy set on the running VM opens its endpoint (no secrets: the
	// TLS session is the upstream's own, end to end).
	if code := s.do("PUT", "/v1/sandboxes/"+plain+"/network", s.key, map[string]any{"allow": []string{allowed}}, nil); code != 200 {
		t.Fatalf("set network on the VM: %d", code)
	}
	if r := s.sh(plain, fmt.Sprintf(`curl -sS --cacert upstream-ca.pem https://%s/later 2>&1`, allowed)); !strings.Contains(r.Stdout, "path=/later auth=none") {
		t.Errorf("VM after a policy was set: %+v", r)
	}
}
