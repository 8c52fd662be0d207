import Glibc
import TesseraAccountsUI

// This thread is GTK's (GtkActor's executor is its main loop): the app is made and run on it.
exit(AccountsApp.main())
