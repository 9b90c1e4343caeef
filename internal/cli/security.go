package cli

import (
	"fmt"

	space "github.com/spacesandbox/space/sdk/go"
	"github.com/spf13/cobra"
)

// securityCommand is `space security probe|report`: the server runs its
// shipped attack suite against itself (admin key needed).
func (a *app) securityCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "security",
		Short: "Run the network and isolation attack suite against the server",
	}
	var req space.SecurityProbeRequest
	probe := &cobra.Command{
		Use:   "probe",
		Short: "Run every bypass probe from inside a fresh sandbox; exit 0 only when none got through",
		Long: "Runs the attack suite (DNS exfiltration, raw IP, IP literals, domain fronting, nested CONNECT, " +
			"metadata and host services, UDP/ICMP/raw sockets, placeholder leaks, CA key and secret reads...) " +
			"from inside a sandbox whose policy allows exactly one destination, prints the results and ends " +
			"with `N probes, M bypassed`. Exit code: 0 none got through, 1 some did, 2 some probes could not decide.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			rep, err := c.RunSecurityProbe(cmd.Context(), req)
			if err != nil {
				return err
			}
			return a.printSecurityReport(rep)
		},
	}
	f := probe.Flags()
	f.StringVar(&req.Allow, "allow", "", "the one destination the probe sandbox may reach, host:port (default allowed.test:443)")
	f.StringVar(&req.SecretHost, "secret-host", "", "host the probe secret is bound to (default: the --allow host)")
	f.StringVar(&req.Forbidden, "forbidden", "", "a name outside the policy to aim at (default other.test)")
	f.StringVar(&req.Unbound, "unbound", "", "a second allowed name the secret is not bound to (placeholder probes)")
	f.StringVar(&req.Rebind, "rebind", "", "an allowed name that resolves to a private address (DNS rebinding probe)")
	f.StringSliceVar(&req.Only, "only", nil, "run only these probe ids")
	report := &cobra.Command{
		Use:   "report",
		Short: "Print the last probe report",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, err := a.sdk()
			if err != nil {
				return err
			}
			rep, err := c.SecurityReport(cmd.Context())
			if err != nil {
				return err
			}
			return a.printSecurityReport(rep)
		},
	}
	cmd.AddCommand(probe, report)
	return cmd
}

func (a *app) printSecurityReport(rep *space.SecurityReport) error {
	fmt.Fprintf(a.stdout, "policy %v, %s to %s\n", rep.Policy, rep.Started.Format("2006-01-02 15:04:05Z"), rep.Finished.Format("15:04:05Z"))
	fmt.Fprint(a.stdout, rep.Table())
	switch {
	case rep.Bypassed > 0:
		return exitCode(1)
	case rep.Errors > 0:
		return exitCode(2)
	}
	return nil
}
