# The admin install, included by the top-level Makefile: the same layout as the Debian and
# RPM packages (admin/README.md), for sites that build from source.
#   make install [DESTDIR=] [PREFIX=/usr/local] [SYSCONFDIR=/etc] [INSTALL_PYTHON=/usr/bin/python3]
#   make uninstall            refused while a plugstack file still loads the plugin, or (a slurmd
#                             node) slurm.conf still runs the hooks
#   make deb | make rpm | make orig | make man
PKG := dispatch-slurm
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
PREFIX ?= /usr/local
BINDIR ?= $(PREFIX)/bin
LIBDIR ?= $(PREFIX)/lib
LIBEXECDIR ?= $(PREFIX)/libexec
DATADIR ?= $(PREFIX)/share
MANDIR ?= $(DATADIR)/man
SYSCONFDIR ?= /etc
DEFAULTSDIR ?= $(SYSCONFDIR)/default
PLUGSTACK ?= $(SYSCONFDIR)/slurm/plugstack.conf
# The hooks' interpreter, and where it imports the package from: for Debian's and RHEL's
# python3 the local site directory (/usr/local/lib/python3.X/...), outside the one the
# distribution's packages own. The package is pure Python; it is copied there with its
# metadata, no pip (PEP 668 refuses pip into the system Python, and rightly: pip would
# resolve and replace distribution packages), no build backend; its one dependency, click,
# comes from the distribution (python3-click).
INSTALL_PYTHON ?= /usr/bin/python3
PYTHONDIR ?= $(shell $(INSTALL_PYTHON) -c 'import sysconfig; print(sysconfig.get_path("purelib"))')
DISTINFO = $(D)$(PYTHONDIR)/dispatch_slurm-$(VERSION).dist-info
HOOKS := prolog/prolog prolog/taskprolog epilog/epilog
MAN := admin/man/dispatch-slurm.1 admin/man/dispatch-slurm-site.conf.5 admin/man/dispatch_env.8
CONF_FILES := $(DEFAULTSDIR)/$(PKG) $(SYSCONFDIR)/$(PKG)/site.conf
D := $(DESTDIR)

.PHONY: install install-admin install-python uninstall deb rpm orig man

install: install-admin install-python

# Everything but the Python package (the packages install that their own way).
install-admin:
	$(MAKE) -C spank_env install DESTDIR=$(abspath $(D)) LIBDIR=$(LIBDIR)/slurm
	install -d $(D)$(LIBEXECDIR)/$(PKG) $(D)$(DATADIR)/$(PKG) $(D)$(DEFAULTSDIR) $(D)$(SYSCONFDIR)/$(PKG) \
	  $(D)$(MANDIR)/man1 $(D)$(MANDIR)/man5 $(D)$(MANDIR)/man8
	install -m 0755 admin/unplug $(D)$(LIBEXECDIR)/$(PKG)/unplug
	for h in $(HOOKS); do \
	  sed 's|^DEFAULTS=.*|DEFAULTS=$(DEFAULTSDIR)/$(PKG)|' $$h >$(D)$(LIBEXECDIR)/$(PKG)/$${h#*/} && \
	  chmod 0755 $(D)$(LIBEXECDIR)/$(PKG)/$${h#*/} || exit 1; done
	sed -e 's|@LIBDIR@|$(LIBDIR)|' -e 's|@DATADIR@|$(DATADIR)|' \
	  -e 's|@CONF@|$(if $(filter /etc,$(SYSCONFDIR)),, conf=$(SYSCONFDIR)/$(PKG)/site.conf)|' \
	  admin/plugstack.conf.in >$(D)$(DATADIR)/$(PKG)/plugstack.conf
	chmod 0644 $(D)$(DATADIR)/$(PKG)/plugstack.conf
	install -m 0644 admin/man/dispatch-slurm.1 $(D)$(MANDIR)/man1/
	install -m 0644 admin/man/dispatch-slurm-site.conf.5 $(D)$(MANDIR)/man5/
	install -m 0644 admin/man/dispatch_env.8 $(D)$(MANDIR)/man8/
	@# configuration: the admin's once installed, never overwritten (as a package's conffile)
	$(call conf,admin/dispatch-slurm.default,$(DEFAULTSDIR)/$(PKG))
	$(call conf,admin/site.conf,$(SYSCONFDIR)/$(PKG)/site.conf)

install-python:
	install -d $(D)$(PYTHONDIR) $(D)$(BINDIR) $(DISTINFO)
	find dispatch_slurm -name '*.py' -o -name py.typed | LC_ALL=C sort | while read -r f; do \
	  install -D -m 0644 "$$f" "$(D)$(PYTHONDIR)/$$f" || exit 1; done
	printf 'Metadata-Version: 2.1\nName: $(PKG)\nVersion: $(VERSION)\nRequires-Dist: click>=8.0\n' >$(DISTINFO)/METADATA
	printf '[console_scripts]\n$(PKG) = dispatch_slurm.cli:main\n' >$(DISTINFO)/entry_points.txt
	echo make >$(DISTINFO)/INSTALLER
	printf '#!$(INSTALL_PYTHON)\nimport sys\nfrom dispatch_slurm.cli import main\nsys.exit(main())\n' >$(D)$(BINDIR)/$(PKG)
	chmod 0755 $(D)$(BINDIR)/$(PKG)

# The plugstack line goes first, as in the packages (admin/unplug: the symlink to the shipped
# line is removed, another file loading the plugin refuses and nothing is removed); then
# spank_env's own guard. Configuration an admin changed stays.
uninstall:
	admin/unplug $(D)$(PLUGSTACK) $(DATADIR)/$(PKG)/plugstack.conf $(LIBEXECDIR)/$(PKG)
	$(MAKE) -C spank_env uninstall DESTDIR=$(abspath $(D)) LIBDIR=$(LIBDIR)/slurm PLUGSTACK=$(PLUGSTACK)
	rm -f $(addprefix $(D)$(LIBEXECDIR)/$(PKG)/,$(notdir $(HOOKS)) unplug) $(D)$(DATADIR)/$(PKG)/plugstack.conf \
	  $(D)$(MANDIR)/man1/dispatch-slurm.1 $(D)$(MANDIR)/man5/dispatch-slurm-site.conf.5 $(D)$(MANDIR)/man8/dispatch_env.8
	$(call unconf,admin/dispatch-slurm.default,$(DEFAULTSDIR)/$(PKG))
	$(call unconf,admin/site.conf,$(SYSCONFDIR)/$(PKG)/site.conf)
	rm -rf $(D)$(PYTHONDIR)/dispatch_slurm $(D)$(PYTHONDIR)/dispatch_slurm-*.dist-info $(D)$(BINDIR)/$(PKG)
	-rmdir $(D)$(LIBEXECDIR)/$(PKG) $(D)$(DATADIR)/$(PKG) $(D)$(SYSCONFDIR)/$(PKG) 2>/dev/null

# The defaults file names the interpreter and the site file when they are not the packages' ones.
CONF_SED = -e '$(if $(filter /usr/bin/python3,$(INSTALL_PYTHON)),,s|^\#PYTHON=.*|PYTHON=$(INSTALL_PYTHON)|)' \
  -e '$(if $(filter /etc,$(SYSCONFDIR)),,s|^\#SITE_CONF=.*|SITE_CONF=$(SYSCONFDIR)/$(PKG)/site.conf|)'
# $(call conf,SOURCE,PATH): install SOURCE at PATH unless the admin already has one.
conf = @if [ -e $(D)$(2) ]; then echo "install: $(D)$(2) kept (the admin's)"; else \
  sed $(CONF_SED) $(1) >$(D)$(2) && chmod 0644 $(D)$(2); fi
# $(call unconf,SOURCE,PATH): remove PATH only if it is still what install wrote.
unconf = @if [ -e $(D)$(2) ]; then \
  if sed $(CONF_SED) $(1) | cmp -s - $(D)$(2); then rm -f $(D)$(2); else echo "uninstall: $(D)$(2) kept (changed by the admin)"; fi; fi

# dispatch-slurm(1) from the click commands (tests/test_package.py checks it is in step).
MAN_PYTHON ?= $(VENV)/bin/python
man:
	$(MAN_PYTHON) admin/man/gen_cli_man.py >admin/man/dispatch-slurm.1.new && mv admin/man/dispatch-slurm.1.new admin/man/dispatch-slurm.1

# The packages are built from a copy of the sources they need (nothing is written beside
# the tree, as dpkg-buildpackage would, and no .venv or build output goes in); the results
# land in dist/.
PKG_SOURCES := Makefile pyproject.toml README.md admin debian dispatch_slurm spank_env prolog epilog
PKG_BUILD := build/pkg
# lintian: every tag an error but the one debian/dispatch-slurm.lintian-overrides explains (LINTIAN=: skips it).
LINTIAN ?= lintian
DEB_ARCH = $(shell dpkg --print-architecture)

orig:
	rm -rf $(PKG_BUILD)/$(PKG)-$(VERSION) && mkdir -p $(PKG_BUILD)/$(PKG)-$(VERSION) dist
	tar -c --exclude=__pycache__ --exclude='*.so' --exclude=test_contract --exclude=test_contexts $(PKG_SOURCES) | tar -x -C $(PKG_BUILD)/$(PKG)-$(VERSION)
	tar -C $(PKG_BUILD) -czf dist/$(PKG)-$(VERSION).tar.gz --owner=root --group=root $(PKG)-$(VERSION)

# pybuild and dh_python3 run the python3 the PATH names, and only Debian's has their modules: a
# venv's or conda's python3 first on PATH fails the build deep inside debhelper. The build runs
# with /usr/bin first, so Debian's python3 is the one used whatever the caller's PATH says.
DEB_PYTHON := /usr/bin/python3
DPKG_BUILDPACKAGE ?= dpkg-buildpackage
deb: orig
	@test -x $(DEB_PYTHON) || { echo "make deb: needs Debian's $(DEB_PYTHON) (apt-get install python3-all dh-python)" >&2; exit 1; }
	rm -f dist/$(PKG)_$(VERSION)_*.deb dist/$(PKG)-dbgsym_$(VERSION)_*.deb
	cd $(PKG_BUILD)/$(PKG)-$(VERSION) && PATH=$(patsubst %/,%,$(dir $(DEB_PYTHON))):$$PATH $(DPKG_BUILDPACKAGE) -us -uc -b
	mv $(PKG_BUILD)/$(PKG)*_$(VERSION)_$(DEB_ARCH).* dist/
	$(LINTIAN) -I --pedantic --fail-on error,warning dist/$(PKG)_$(VERSION)_$(DEB_ARCH).changes
	@ls dist/$(PKG)_$(VERSION)_$(DEB_ARCH).deb

# RHEL's paths (%{_libdir}/slurm is its Slurm's plugin dir, /etc/sysconfig its defaults
# directory); on Debian, rpmbuild from the `rpm` package builds it the same way.
rpm: orig
	mkdir -p $(PKG_BUILD)/rpm/SOURCES && cp dist/$(PKG)-$(VERSION).tar.gz $(PKG_BUILD)/rpm/SOURCES/
	rpmbuild --nodeps -bb -D'_topdir $(abspath $(PKG_BUILD)/rpm)' -D'pkg_version $(VERSION)' admin/$(PKG).spec
	mv $(PKG_BUILD)/rpm/RPMS/*/$(PKG)-$(VERSION)-*.rpm dist/
	@ls dist/$(PKG)-$(VERSION)-*.rpm
