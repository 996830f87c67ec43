package cli

import (
	"fmt"
	"os"
	"strings"

	"github.com/spf13/pflag"
)

// Prepare reads PREFIXD_<FLAG> variables into the flags of fs not given
// on the command line (FromEnv), then validates o.
func Prepare(fs *pflag.FlagSet, o interface{ Validate() error }) error {
	if err := FromEnv(fs); err != nil {
		return err
	}
	return o.Validate()
}

// FromEnv sets every flag of fs not given on the command line from
// PREFIXD_<FLAG> (upper case, dashes as underscores); an unset or empty
// variable leaves the flag alone. The error names the variable whose value
// the flag refused.
func FromEnv(fs *pflag.FlagSet) error {
	var err error
	fs.VisitAll(func(f *pflag.Flag) {
		if f.Changed || err != nil {
			return
		}
		name := "PREFIXD_" + strings.ToUpper(strings.ReplaceAll(f.Name, "-", "_"))
		if v, ok := os.LookupEnv(name); ok && v != "" {
			if e := fs.Set(f.Name, v); e != nil {
				err = fmt.Errorf("%s=%q: %w", name, v, e)
			}
		}
	})
	return err
}
