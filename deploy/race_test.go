//go:build race

package deploy

// raceBuild makes the test build the prefixd binary with -race too, so that
// it reuses the packages the test binary was compiled with.
const raceBuild = true
